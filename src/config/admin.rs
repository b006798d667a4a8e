//! `[admin]`: the admin API's token.

use serde::Deserialize;

use super::secret::Secret;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    pub token: Secret,
}
