//! `[selection]`: the order sources are asked in, and the anonymous-number categories.

use serde::Deserialize;

use super::error::{Mistake, invalid};
use crate::domain::Source;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionConfig {
    pub order: Vec<Source>,
    pub anonymous_categories: Vec<u64>,
}

impl SelectionConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        if self.order.is_empty() {
            found.push(invalid("selection.order", "must name at least one source"));
        }
        for (i, source) in self.order.iter().enumerate() {
            if self.order[..i].contains(source) {
                found.push(invalid(
                    "selection.order",
                    format!("\"{}\" is listed twice", source.as_str()),
                ));
            }
        }
        for category in &self.anonymous_categories {
            if crate::domain::CategoryId::new(*category).is_err() {
                found.push(invalid(
                    "selection.anonymous_categories",
                    format!("{category} is not a category id (1..=2147483647)"),
                ));
            }
        }
    }
}
