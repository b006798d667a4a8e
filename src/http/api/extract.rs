//! Extractors whose rejections are `ApiError`s: a JSON body, path parameters, the
//! lookup's query, and a header read singly (a repeated one is a 400 naming it).

use std::borrow::Cow;

use axum::body::Bytes;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::header::AsHeaderName;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::limits;
use crate::config::ServerConfig;
use crate::domain::Phone;
use crate::domain::{AdId, CategoryId, UserId};
use crate::resolve::Request as ResolveRequest;

/// A JSON body, bounded by the state's `[server]` limits ([`limits::json_body`]).
pub struct Json<T>(pub T);

impl<S, T> FromRequest<S> for Json<T>
where
    S: Send + Sync,
    ServerConfig: FromRef<S>,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        require_json(req.headers())?;
        let limit = limits::json_body(&ServerConfig::from_ref(state));
        let read = Bytes::from_request(req, state);
        let bytes = tokio::time::timeout(limit.read_timeout, read)
            .await
            .map_err(|_| ApiError::RequestTimeout)?
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge(limit.max_bytes)
                } else {
                    ApiError::bad_request(format!("could not read the body: {rejection}"))
                }
            })?;
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// A 415 unless the body is declared JSON; checked before the body is read.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(ApiError::UnsupportedMediaType);
    };
    let essence = value
        .as_bytes()
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    let essence = essence.trim_ascii();
    let mut parts = essence.splitn(2, |&b| b == b'/');
    let (Some(kind), Some(subtype)) = (parts.next(), parts.next()) else {
        return Err(ApiError::UnsupportedMediaType);
    };
    let subtype = subtype.to_ascii_lowercase();
    let json = subtype == b"json"
        || (subtype.len() > b"+json".len()
            && subtype.ends_with(b"+json")
            && !subtype.contains(&b'/'));
    if kind.eq_ignore_ascii_case(b"application") && json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType)
    }
}

/// The value of a header read singly, if given, in one map lookup (the hit
/// path reads `X-Viewer-Id` so). A 400 naming the header (`shown`, as the docs
/// write it) when it is given more than once.
pub fn single_header<'h>(
    headers: &'h HeaderMap,
    name: impl AsHeaderName,
    shown: &str,
) -> Result<Option<&'h HeaderValue>, ApiError> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (first, None) => Ok(first),
        (_, Some(_)) => Err(repeated_header(shown)),
    }
}

pub fn repeated_header(shown: &str) -> ApiError {
    field_error(shown, "given more than once")
}

/// Path parameters, rejected as a problem document naming the parameter
/// (axum's own rejection is a `text/plain` 400).
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(path_error(&rejection)),
        }
    }
}

fn path_error(rejection: &PathRejection) -> ApiError {
    let PathRejection::FailedToDeserializePathParams(failed) = rejection else {
        return ApiError::bad_request(format!("path: {}", rejection.body_text()));
    };
    match failed.kind() {
        ErrorKind::InvalidUtf8InPathParam { key } => {
            field_error(key, "not valid UTF-8 once percent-decoded")
        }
        ErrorKind::ParseErrorAtKey {
            key, expected_type, ..
        } => field_error(key, format!("must be {expected_type}")),
        ErrorKind::DeserializeError { key, message, .. } => field_error(key, message),
        other => ApiError::bad_request(format!("path: {other}")),
    }
}

/// Parses the query of `GET /v1/public-phone`. Unknown parameters are ignored;
/// a known one given twice is refused. Form-decoded, with one leniency: a
/// `phone` whose raw value starts with a literal `+` keeps it as a plus (the
/// common client mistake; no valid number starts with a space).
pub fn public_phone_query(query: Option<&str>) -> Result<ResolveRequest, ApiError> {
    let query = query.unwrap_or_default();
    let QueryFields {
        user,
        ad,
        category,
        phone,
    } = QueryFields::of(query)?;
    // The leniency is a second reading, tried only when the form-decoded one fails.
    let raw_plus = || query.split('&').any(|pair| pair.starts_with("phone=+"));
    let phone = phone
        .map(|p| {
            Phone::parse(&p).or_else(|error| match p.strip_prefix(' ') {
                Some(rest) if raw_plus() => Phone::parse(&format!("+{rest}")).map_err(|_| error),
                _ => Err(error),
            })
        })
        .transpose()
        .map_err(|e| field_error("phone", e));
    let user = required("user_id", user)?;
    let ad = required("ad_id", ad)?;
    let category = required("category_id", category)?;
    Ok(ResolveRequest {
        user: UserId::parse(&user).map_err(|e| field_error("user_id", e))?,
        ad: AdId::parse(&ad).map_err(|e| field_error("ad_id", e))?,
        category: CategoryId::parse(&category).map_err(|e| field_error("category_id", e))?,
        phone: phone?,
    })
}

#[derive(Debug, Default, PartialEq)]
struct QueryFields<'a> {
    user: Option<Cow<'a, str>>,
    ad: Option<Cow<'a, str>>,
    category: Option<Cow<'a, str>>,
    phone: Option<Cow<'a, str>>,
}

impl<'a> QueryFields<'a> {
    fn of(query: &'a str) -> Result<Self, ApiError> {
        // Without `%` or `+` form decoding changes nothing: split in place (the hit
        // path); `&` and `=` are ASCII, so every slice is on a character boundary.
        let mut fields = QueryFields::default();
        let (mut start, mut equals) = (0, None);
        for (i, byte) in query.bytes().chain([b'&']).enumerate() {
            match byte {
                b'%' | b'+' => return Self::decoded(query),
                b'=' if equals.is_none() => equals = Some(i),
                b'&' => {
                    if i > start {
                        let (key, value) = match equals {
                            Some(e) => (&query[start..e], &query[e + 1..i]),
                            None => (&query[start..i], ""),
                        };
                        fields.set(key, Cow::Borrowed(value))?;
                    }
                    (start, equals) = (i + 1, None);
                }
                _ => {}
            }
        }
        Ok(fields)
    }

    fn decoded(query: &'a str) -> Result<Self, ApiError> {
        let mut fields = QueryFields::default();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            fields.set(&key, value)?;
        }
        Ok(fields)
    }

    fn set(&mut self, key: &str, value: Cow<'a, str>) -> Result<(), ApiError> {
        let slot = match key {
            "user_id" => &mut self.user,
            "ad_id" => &mut self.ad,
            "category_id" => &mut self.category,
            "phone" => &mut self.phone,
            _ => return Ok(()),
        };
        if slot.replace(value).is_some() {
            return Err(ApiError::bad_request(format!(
                "{key}: given more than once"
            )));
        }
        Ok(())
    }
}

fn required<T>(name: &str, value: Option<T>) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::bad_request(format!("{name}: required")))
}

pub fn field_error(field: &str, error: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("{field}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(query: &str) -> String {
        match public_phone_query(Some(query)) {
            Err(ApiError::BadRequest(detail)) => detail,
            other => panic!("{query}: expected 400, got {other:?}"),
        }
    }

    #[test]
    fn parses_a_full_query() {
        let full = "user_id=42&ad_id=1001&category_id=9&phone=%2B7%20916%20123-45-67&x=1";
        let r = public_phone_query(Some(full)).unwrap();
        assert_eq!(r.user.get(), 42);
        assert_eq!(r.ad.get(), 1001);
        assert_eq!(r.category.get(), 9);
        assert_eq!(r.phone.unwrap().to_string(), "+79161234567");
        let r = public_phone_query(Some("user_id=42&ad_id=1&category_id=9&phone=+79161234567"))
            .unwrap();
        assert_eq!(r.phone.unwrap().to_string(), "+79161234567");
    }

    #[test]
    fn splitting_in_place_reads_as_form_decoding() {
        for query in [
            "user_id=42&ad_id=1001&category_id=9",
            "&&user_id=42&&ad_id=1001&category_id=9&x&y=&=z&=&",
            "user_id=42&ad_id=1001&category_id=9&phone=(916)1234567&phone_x=1",
            "user_id=42&ad_id=1001&category_id",
            "user_id&user_id=",
            "user_id=4=2&ad_id==1",
            "ad_id=1&ad_id=2",
            "",
        ] {
            let fast = QueryFields::of(query).map_err(|e| format!("{e:?}"));
            let decoded = QueryFields::decoded(query).map_err(|e| format!("{e:?}"));
            assert_eq!(fast, decoded, "{query}");
        }
        let pieces = ["user_id", "ad_id", "phone", "=", "&", "1", "x", "é"];
        let mut seed = 12345u64;
        for _ in 0..20_000 {
            let mut query = String::new();
            for _ in 0..(seed % 12) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                query.push_str(pieces[(seed >> 33) as usize % pieces.len()]);
            }
            let fast = QueryFields::of(&query).map_err(|e| format!("{e:?}"));
            let decoded = QueryFields::decoded(&query).map_err(|e| format!("{e:?}"));
            assert_eq!(fast, decoded, "{query}");
        }
    }

    #[test]
    fn names_the_bad_parameter() {
        assert!(detail("ad_id=1&category_id=1").starts_with("user_id: required"));
        assert!(detail("user_id=0&ad_id=1&category_id=1").starts_with("user_id:"));
        assert!(detail("user_id=1&ad_id=9223372036854775808&category_id=1").starts_with("ad_id:"));
        assert!(detail("user_id=1&ad_id=1&category_id=2147483648").starts_with("category_id:"));
        assert!(detail("user_id=1&ad_id=1&category_id=1&phone=").starts_with("phone:"));
        assert!(detail("user_id=1&ad_id=1&category_id=1&phone=79161234567").starts_with("phone:"));
        assert!(detail("user_id=1&user_id=2&ad_id=1&category_id=1").contains("more than once"));
    }
}
