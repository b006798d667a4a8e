//! The batch body's items, read by visitors of our own rather than as a
//! `serde_json::Value` each; [`batch_item`] answers as the single lookup's query.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::error::ApiError;
use super::extract::field_error;
use super::limits::MAX_BATCH_ITEMS;
use crate::domain::{AdId, CategoryId, Phone, UserId};
use crate::resolve::Request as ResolveRequest;

/// The `items` of a batch body: the first [`MAX_BATCH_ITEMS`] kept, the rest only
/// counted (`IgnoredAny`, no allocation) so the 400 can say how many.
#[derive(Debug, Default)]
pub struct BatchItems {
    pub kept: Vec<BatchItem>,
    /// The skipped items included.
    pub count: usize,
}

impl<'de> Deserialize<'de> for BatchItems {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> Visitor<'de> for Items {
            type Value = BatchItems;
            // serde's own wording for a `Vec`.
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BatchItems, A::Error> {
                let mut items = BatchItems::default();
                while items.kept.len() < MAX_BATCH_ITEMS {
                    match seq.next_element::<BatchItem>()? {
                        Some(item) => items.kept.push(item),
                        None => break,
                    }
                }
                items.count = items.kept.len();
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    items.count += 1;
                }
                Ok(items)
            }
        }
        d.deserialize_seq(Items)
    }
}

/// One batch item as far as [`batch_item`] reads it: unknown keys and nested
/// values skipped, the last of duplicate keys kept (as in a `serde_json::Map`).
#[derive(Debug, Default)]
pub struct BatchItem {
    object: bool,
    user_id: Integer,
    ad_id: Integer,
    category_id: Integer,
    phone: Text,
}

impl BatchItem {
    /// When a JSON integer that fits an i64 (what a failed item's result names).
    pub fn ad_id(&self) -> Option<i64> {
        match self.ad_id {
            Integer::Unsigned(n) => i64::try_from(n).ok(),
            Integer::Negative(n) => Some(n),
            Integer::Null | Integer::Other => None,
        }
    }
}

/// A field meant to be an integer, as `serde_json::Value` tells it apart.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Integer {
    /// Missing or null.
    #[default]
    Null,
    Unsigned(u64),
    Negative(i64),
    /// A float, string, boolean, array or object.
    Other,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Text {
    /// Missing or null.
    #[default]
    Null,
    Given(String),
    /// A number, boolean, array or object.
    Other,
}

enum Scalar<'a> {
    Null,
    Unsigned(u64),
    Negative(i64),
    Str(Cow<'a, str>),
    Other,
}

/// Reads any JSON value into a [`Scalar`], skipping the inside of arrays and
/// objects. `keep_text`: only `phone`'s string is needed.
struct ScalarVisitor {
    keep_text: bool,
}

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Scalar<'de>, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_u64<E>(self, n: u64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Unsigned(n))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Scalar<'de>, E> {
        Ok(u64::try_from(n).map_or(Scalar::Negative(n), Scalar::Unsigned))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Scalar<'de>, E> {
        Ok(if self.keep_text {
            Scalar::Str(Cow::Borrowed(s))
        } else {
            Scalar::Other
        })
    }
    fn visit_str<E>(self, s: &str) -> Result<Scalar<'de>, E> {
        Ok(if self.keep_text {
            Scalar::Str(Cow::Owned(s.to_owned()))
        } else {
            Scalar::Other
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(
            match d.deserialize_any(ScalarVisitor { keep_text: false })? {
                Scalar::Null => Integer::Null,
                Scalar::Unsigned(n) => Integer::Unsigned(n),
                Scalar::Negative(n) => Integer::Negative(n),
                Scalar::Str(_) | Scalar::Other => Integer::Other,
            },
        )
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(
            match d.deserialize_any(ScalarVisitor { keep_text: true })? {
                Scalar::Null => Text::Null,
                Scalar::Str(s) => Text::Given(s.into_owned()),
                Scalar::Unsigned(_) | Scalar::Negative(_) | Scalar::Other => Text::Other,
            },
        )
    }
}

enum ItemField {
    UserId,
    AdId,
    CategoryId,
    Phone,
    Other,
}

impl<'de> Deserialize<'de> for ItemField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemFields;
        impl Visitor<'_> for ItemFields {
            type Value = ItemField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<ItemField, E> {
                Ok(match key {
                    "user_id" => ItemField::UserId,
                    "ad_id" => ItemField::AdId,
                    "category_id" => ItemField::CategoryId,
                    "phone" => ItemField::Phone,
                    _ => ItemField::Other,
                })
            }
        }
        d.deserialize_str(ItemFields)
    }
}

impl<'de> Deserialize<'de> for BatchItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Item;
        impl<'de> Visitor<'de> for Item {
            type Value = BatchItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BatchItem, A::Error> {
                let mut item = BatchItem {
                    object: true,
                    ..BatchItem::default()
                };
                while let Some(key) = map.next_key::<ItemField>()? {
                    match key {
                        ItemField::UserId => item.user_id = map.next_value()?,
                        ItemField::AdId => item.ad_id = map.next_value()?,
                        ItemField::CategoryId => item.category_id = map.next_value()?,
                        ItemField::Phone => item.phone = map.next_value()?,
                        ItemField::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(item)
            }
            // Anything but an object is an item that is not one: its own 400.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BatchItem, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(BatchItem::default())
            }
            fn visit_unit<E>(self) -> Result<BatchItem, E> {
                Ok(BatchItem::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<BatchItem, E> {
                Ok(BatchItem::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<BatchItem, E> {
                Ok(BatchItem::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<BatchItem, E> {
                Ok(BatchItem::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<BatchItem, E> {
                Ok(BatchItem::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<BatchItem, E> {
                Ok(BatchItem::default())
            }
        }
        d.deserialize_any(Item)
    }
}

/// Parses one batch item (numbers as JSON integers), refused as
/// `extract::public_phone_query` refuses a query.
pub fn batch_item(item: &BatchItem) -> Result<ResolveRequest, ApiError> {
    if !item.object {
        return Err(ApiError::bad_request("item: must be a JSON object"));
    }
    let integer = |name: &str, field: Integer| -> Result<u64, ApiError> {
        match field {
            Integer::Null => Err(ApiError::bad_request(format!("{name}: required"))),
            Integer::Unsigned(n) => Ok(n),
            Integer::Negative(_) | Integer::Other => Err(ApiError::bad_request(format!(
                "{name}: must be a positive JSON integer"
            ))),
        }
    };
    let user =
        UserId::new(integer("user_id", item.user_id)?).map_err(|e| field_error("user_id", e))?;
    let ad = AdId::new(integer("ad_id", item.ad_id)?).map_err(|e| field_error("ad_id", e))?;
    let category = CategoryId::new(integer("category_id", item.category_id)?)
        .map_err(|e| field_error("category_id", e))?;
    let phone = match &item.phone {
        Text::Null => None,
        Text::Given(text) => Some(Phone::parse(text).map_err(|e| field_error("phone", e))?),
        Text::Other => return Err(ApiError::bad_request("phone: must be a string")),
    };
    Ok(ResolveRequest {
        user,
        ad,
        category,
        phone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `batch_item` did when every item was a `serde_json::Value`: the
    /// reference the reduced items are held equal to.
    fn reference(item: &serde_json::Value) -> Result<ResolveRequest, ApiError> {
        let object = item
            .as_object()
            .ok_or_else(|| ApiError::bad_request("item: must be a JSON object"))?;
        let integer = |name: &str| -> Result<u64, ApiError> {
            match object.get(name) {
                None | Some(serde_json::Value::Null) => {
                    Err(ApiError::bad_request(format!("{name}: required")))
                }
                Some(value) => value.as_u64().ok_or_else(|| {
                    ApiError::bad_request(format!("{name}: must be a positive JSON integer"))
                }),
            }
        };
        let user = UserId::new(integer("user_id")?).map_err(|e| field_error("user_id", e))?;
        let ad = AdId::new(integer("ad_id")?).map_err(|e| field_error("ad_id", e))?;
        let category =
            CategoryId::new(integer("category_id")?).map_err(|e| field_error("category_id", e))?;
        let phone = match object.get("phone") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(text)) => {
                Some(Phone::parse(text).map_err(|e| field_error("phone", e))?)
            }
            Some(_) => return Err(ApiError::bad_request("phone: must be a string")),
        };
        Ok(ResolveRequest {
            user,
            ad,
            category,
            phone,
        })
    }

    fn outcome(result: Result<ResolveRequest, ApiError>) -> String {
        match result {
            Ok(r) => format!("ok {} {} {} {:?}", r.user, r.ad, r.category, r.phone),
            Err(e) => format!("{e:?}"),
        }
    }

    /// Every item answers as from a `Value`: the same request or problem, and
    /// the same `ad_id` beside a problem.
    #[test]
    fn reduced_items_answer_as_values_did() {
        // JSON texts, split at " | ".
        let values = concat!(
            r#"1 | 0 | -1 | 9223372036854775807 | 9223372036854775808 | "#,
            r#"18446744073709551615 | 18446744073709551616 | -9223372036854775808 | "#,
            r#"1.0 | 1.5 | -0 | 1e3 | true | null | "1" | "+79161234567" | "#,
            r#""+7 (916) 123-45-67" | "79161234567" | "" | [] | [1] | {} | {"a":[1,{}]} | "#,
            r#"2147483648 | 2147483647"#
        );
        let values: Vec<&str> = values.split(" | ").collect();
        let keys = "user_id ad_id category_id phone other user\\u005fid";
        let keys: Vec<&str> = keys.split(' ').collect();
        let items = ["1", "\"x\"", "null", "[]", "[{}]", "true", "-2.5"];
        let mut items: Vec<String> = items.iter().map(|s| (*s).to_owned()).collect();
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for _ in 0..20_000 {
            let fields: Vec<String> = (0..next(7))
                .map(|_| {
                    format!(
                        "\"{}\":{}",
                        keys[next(keys.len())],
                        values[next(values.len())]
                    )
                })
                .collect();
            items.push(format!("{{{}}}", fields.join(",")));
        }
        for value in values {
            for key in &keys[..4] {
                let mut item = serde_json::json!({ "user_id": 1, "ad_id": 2, "category_id": 3 });
                item[*key] = serde_json::from_str(value).unwrap();
                items.push(item.to_string());
            }
        }
        for text in &items {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let reduced: BatchItem = serde_json::from_str(text).unwrap();
            let want = outcome(reference(&value));
            assert_eq!(outcome(batch_item(&reduced)), want, "{text}");
            let ad_id = value.get("ad_id").and_then(serde_json::Value::as_i64);
            assert_eq!(reduced.ad_id(), ad_id, "{text}");
        }
    }

    #[derive(serde::Deserialize)]
    struct Body {
        items: BatchItems,
    }

    #[test]
    fn items_past_the_limit_are_counted_not_kept() {
        let body: Body =
            serde_json::from_str(r#"{"items":[{"user_id":1},2,[3],{"x":{}}]}"#).unwrap();
        assert_eq!((body.items.kept.len(), body.items.count), (4, 4));
        let zeros = format!("{{\"items\":[{}0]}}", "0,".repeat(100));
        let body: Body = serde_json::from_str(&zeros).unwrap();
        assert_eq!((body.items.kept.len(), body.items.count), (100, 101));
        for (body, error) in [
            (r#"{"items":"x"}"#, "expected a sequence"),
            (r#"{"items":[1,2"#, "EOF"),
        ] {
            let e = serde_json::from_str::<Body>(body).err();
            let e = e.unwrap().to_string();
            assert!(e.contains(error), "{e}");
        }
    }

    // The allocator counts, so the test below can measure a parse (stats_alloc
    // keeps the unsafe out of this crate). Other tests of this binary allocate
    // beside it, which only adds: the bound holds on the least of the runs.
    #[global_allocator]
    static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

    /// A 1 MiB body of `[0,0,0,...]` parses into the 100 kept and a count:
    /// well under a megabyte allocated.
    #[test]
    fn a_megabyte_of_zeros_allocates_almost_nothing() {
        let mut body = String::from("{\"items\":[0");
        while body.len() < (1 << 20) - 2 {
            body.push_str(",0");
        }
        body.push_str("]}");
        let zeros = body.matches('0').count();
        // Up to 200 runs, stopping at the first under the bound: a run that
        // other tests' allocations pushed over it says nothing.
        let bound = 256 * 1024;
        let least = (0..200)
            .map(|_| {
                let region = stats_alloc::Region::new(GLOBAL);
                let parsed: Body = serde_json::from_slice(body.as_bytes()).unwrap();
                let allocated = region.change().bytes_allocated;
                assert_eq!(parsed.items.count, zeros);
                drop(parsed);
                allocated
            })
            .scan(usize::MAX, |least, allocated| {
                let done = *least < bound;
                *least = (*least).min(allocated);
                (!done).then_some(*least)
            })
            .last()
            .unwrap_or(usize::MAX);
        assert!(least < bound, "{least} bytes allocated");
    }
}
