//! Why a buyer was shown the kind of number they were: the [`Reason`] the
//! selection rules give with every answer, stored with its reveal and counted.
//! Every word and code: docs/rules.md, "Why this number".

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::source::{Source, Sources};

/// How a source's call ended without an answer: its upstream's verdict (the
/// first six), or undecided (the rest: no word from the upstream). Each number is
/// stored in the reveal log ([`Reason::encode`]) and never changed nor reused (the
/// test `stored_numbers_are_frozen`); the verdicts keep 1 to 6 ([`Code::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Failure {
    Timeout = 1,
    ErrorStatus = 2,
    Rejected = 3,
    Connect = 4,
    Invalid = 5,
    CircuitOpen = 6,
    LoadRefused = 7,
    Load = 8,
    Bound = 9,
    LostTime = 10,
    Deadline = 11,
    Gateway = 12,
    HalfOpen = 13,
}

impl Failure {
    /// Every failure, in number order.
    pub const ALL: [Failure; 13] = [
        Failure::Timeout,
        Failure::ErrorStatus,
        Failure::Rejected,
        Failure::Connect,
        Failure::Invalid,
        Failure::CircuitOpen,
        Failure::LoadRefused,
        Failure::Load,
        Failure::Bound,
        Failure::LostTime,
        Failure::Deadline,
        Failure::Gateway,
        Failure::HalfOpen,
    ];

    /// The code's word, as docs/rules.md, the reveal pages and logs write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::ErrorStatus => "error_status",
            Failure::Rejected => "rejected",
            Failure::Connect => "connect",
            Failure::Invalid => "invalid",
            Failure::CircuitOpen => "circuit_open",
            Failure::LoadRefused => "load_refused",
            Failure::Load => "load",
            Failure::Bound => "bound",
            Failure::LostTime => "lost_time",
            Failure::Deadline => "deadline",
            Failure::Gateway => "gateway",
            Failure::HalfOpen => "half_open",
        }
    }

    /// Whether this is the upstream's verdict (its `on_error` applies) rather than
    /// undecided. Exhaustive: a new failure is not undecided by default.
    pub fn is_verdict(self) -> bool {
        match self {
            Failure::Timeout
            | Failure::ErrorStatus
            | Failure::Rejected
            | Failure::Connect
            | Failure::Invalid
            | Failure::CircuitOpen => true,
            Failure::LoadRefused
            | Failure::Load
            | Failure::Bound
            | Failure::LostTime
            | Failure::Deadline
            | Failure::Gateway
            | Failure::HalfOpen => false,
        }
    }

    /// Its stored number (1 to 13).
    fn bits(self) -> u32 {
        u32::from(self as u8)
    }

    fn from_bits(bits: u32) -> Option<Failure> {
        Failure::ALL.into_iter().find(|f| f.bits() == bits)
    }
}

/// Why a source above the answering one did not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    NotApplicable,
    NoNumber,
    Failed(Failure),
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotApplicable => "not_applicable",
            Skip::NoNumber => "no_number",
            Skip::Failed(failure) => failure.as_str(),
        }
    }

    /// 1 not applicable, 2 no number, 3 to 15 a failure.
    fn bits(self) -> u32 {
        match self {
            Skip::NotApplicable => 1,
            Skip::NoNumber => 2,
            Skip::Failed(failure) => 2 + failure.bits(),
        }
    }

    fn from_bits(bits: u32) -> Option<Skip> {
        match bits {
            1 => Some(Skip::NotApplicable),
            2 => Some(Skip::NoNumber),
            n => Failure::from_bits(n.checked_sub(2)?).map(Skip::Failed),
        }
    }
}

/// Where the answering number came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    Cache,
    Upstream,
    /// A stale entry, standing in for this outcome of the upstream's call.
    Stale(Failure),
    Phone,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Cache => "cache",
            Origin::Upstream => "upstream",
            Origin::Stale(_) => "stale",
            Origin::Phone => "phone",
        }
    }
}

/// The one code that decided an answer: the label `reason` of
/// `phones_gateway_answers_total`. An index into [`Code::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code(u8);

/// The codes a skip can give, per source: no number, then the verdicts.
const SKIP_CODES: usize = 7;

impl Code {
    /// Every code: the four origins, then per source (anonymous, call
    /// tracking, real) `<source>_no_number` and `<source>_<verdict>`, then
    /// `phone_calltracking_failed` (added last: the others keep their places).
    pub const ALL: [&'static str; 4 + 3 * SKIP_CODES + 1] = [
        "cache",
        "upstream",
        "stale",
        "phone",
        "anonymous_no_number",
        "anonymous_timeout",
        "anonymous_error_status",
        "anonymous_rejected",
        "anonymous_connect",
        "anonymous_invalid",
        "anonymous_circuit_open",
        "calltracking_no_number",
        "calltracking_timeout",
        "calltracking_error_status",
        "calltracking_rejected",
        "calltracking_connect",
        "calltracking_invalid",
        "calltracking_circuit_open",
        "real_no_number",
        "real_timeout",
        "real_error_status",
        "real_rejected",
        "real_connect",
        "real_invalid",
        "real_circuit_open",
        "phone_calltracking_failed",
    ];

    /// `phone_calltracking_failed`: the last of [`Code::ALL`].
    const PHONE_CALLTRACKING_FAILED: Code = Code(25);

    fn origin(origin: Origin) -> Code {
        Code(match origin {
            Origin::Cache => 0,
            Origin::Upstream => 1,
            Origin::Stale(_) => 2,
            Origin::Phone => 3,
        })
    }

    /// A skip's code; `None` for "not applicable", which decides nothing.
    fn skip(source: Source, skip: Skip) -> Option<Code> {
        let offset = match skip {
            Skip::NotApplicable => return None,
            Skip::NoNumber => 0,
            // Only verdicts let the order go on; an undecided failure never
            // reaches a skip (the rules stop there).
            Skip::Failed(failure) if failure.is_verdict() => failure.bits(),
            Skip::Failed(_) => return None,
        };
        u8::try_from(4 + source.column() * SKIP_CODES + offset as usize)
            .ok()
            .map(Code)
    }

    /// The position in [`Code::ALL`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    pub fn as_str(self) -> &'static str {
        Code::ALL[self.index()]
    }
}

/// Why this kind of number was shown: each source above the answering one
/// that did not answer, and why; where the answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason {
    /// By source: why it did not answer, for the sources above the answering
    /// one in `selection.order`; `None` for the others.
    skipped: Sources<Option<Skip>>,
    /// The sources above, in `selection.order` (the last one is nearest to
    /// the answer): positions in [`Source::ALL`], as many as `above`.
    order: [u8; 2],
    above: u8,
    origin: Origin,
}

impl Reason {
    /// An answer from `origin` with no source above it.
    pub fn new(origin: Origin) -> Self {
        Reason {
            skipped: Sources::new(None, None, None),
            order: [0; 2],
            above: 0,
            origin,
        }
    }

    /// `source`, the next source above the answer in the order, did not
    /// answer because of `skip`. At most two sources are above any answer.
    #[must_use]
    pub fn skipped(mut self, source: Source, skip: Skip) -> Self {
        if self.skipped[source].is_none() && usize::from(self.above) < self.order.len() {
            self.skipped[source] = Some(skip);
            self.order[usize::from(self.above)] = column(source);
            self.above += 1;
        }
        self
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The sources above the answer with why each did not answer, in `selection.order`.
    pub fn skips(&self) -> impl Iterator<Item = (Source, Skip)> + '_ {
        self.order[..usize::from(self.above)]
            .iter()
            .filter_map(|&c| Source::ALL.get(usize::from(c)).copied())
            .filter_map(|source| self.skipped[source].map(|skip| (source, skip)))
    }

    /// The one code that decided the answer (the metric's label), chosen as
    /// docs/rules.md, "Why this number", says.
    pub fn code(&self) -> Code {
        if self.origin == Origin::Phone {
            return match self.skipped[Source::Calltracking] {
                Some(Skip::Failed(failure)) if failure.is_verdict() => {
                    Code::PHONE_CALLTRACKING_FAILED
                }
                _ => Code::origin(Origin::Phone),
            };
        }
        let nearest = |want: fn(Skip) -> bool| {
            self.skips()
                .filter(|(_, skip)| want(*skip))
                .filter_map(|(source, skip)| Code::skip(source, skip))
                .last()
        };
        nearest(|skip| matches!(skip, Skip::Failed(_)))
            .or_else(|| nearest(|skip| skip == Skip::NoNumber))
            .unwrap_or(Code::origin(self.origin))
    }

    /// The reason as an integer of 22 bits, for the reveal log: 4 bits per
    /// source (in [`Source::ALL`]'s order; 0 = not above the answer, else
    /// [`Skip`]'s code), 2 bits of origin, 4 bits of what a stale value stood
    /// in for, then 4 bits of the order of the sources above (2 each).
    pub fn encode(self) -> u32 {
        let mut bits = 0;
        for (i, skip) in self.skipped.values().enumerate() {
            bits |= skip.map_or(0, Skip::bits) << (4 * i);
        }
        let (origin, stood_in_for) = match self.origin {
            Origin::Cache => (0, 0),
            Origin::Upstream => (1, 0),
            Origin::Stale(failure) => (2, failure.bits()),
            Origin::Phone => (3, 0),
        };
        bits |= origin << 12;
        bits |= stood_in_for << 14;
        let mut order = 0;
        for (i, &c) in self.order[..usize::from(self.above)].iter().enumerate() {
            order |= (u32::from(c) + 1) << (2 * i);
        }
        bits | order << 18
    }

    /// The reason [`Reason::encode`] gave `bits`; `None` for bits it never gives.
    pub fn decode(bits: u32) -> Option<Reason> {
        let origin = match (bits >> 12) & 0b11 {
            0 => Origin::Cache,
            1 => Origin::Upstream,
            2 => Origin::Stale(Failure::from_bits((bits >> 14) & 0xf)?),
            _ => Origin::Phone,
        };
        let mut reason = Reason::new(origin);
        let mut order = bits >> 18;
        while order & 0b11 != 0 {
            let source = *Source::ALL.get(((order & 0b11) - 1) as usize)?;
            let skip = Skip::from_bits((bits >> (4 * column(source))) & 0xf)?;
            reason = reason.skipped(source, skip);
            order >>= 2;
        }
        (reason.encode() == bits).then_some(reason)
    }
}

/// `source`'s column ([`Source::column`], below 3), as a reason's bits hold it.
fn column(source: Source) -> u8 {
    source.column() as u8
}

/// The JSON the admin reveal pages show (docs/rules.md, "Why this number").
impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Skips<'a>(&'a Reason);
        impl Serialize for Skips<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(usize::from(self.0.above)))?;
                for (source, skip) in self.0.skips() {
                    map.serialize_entry(source.as_str(), skip.as_str())?;
                }
                map.end()
            }
        }
        let stale = match self.origin {
            Origin::Stale(failure) => Some(failure),
            _ => None,
        };
        let mut map = serializer.serialize_map(Some(3 + usize::from(stale.is_some())))?;
        map.serialize_entry("code", self.code().as_str())?;
        map.serialize_entry("sources", &Skips(self))?;
        map.serialize_entry("origin", self.origin.as_str())?;
        if let Some(failure) = stale {
            map.serialize_entry("stood_in_for", failure.as_str())?;
        }
        map.end()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use Source::{Anonymous, Calltracking, RealPhone};

    /// The numbers the reveal log stores: a failure's, and a whole reason's
    /// for a few shapes. A change here renumbers reveals already stored.
    #[test]
    fn stored_numbers_are_frozen() {
        let numbers: Vec<_> = Failure::ALL
            .iter()
            .map(|f| (f.as_str(), f.bits()))
            .collect();
        #[rustfmt::skip]
        let frozen = [
            ("timeout", 1), ("error_status", 2), ("rejected", 3), ("connect", 4), ("invalid", 5),
            ("circuit_open", 6), ("load_refused", 7), ("load", 8), ("bound", 9),
            ("lost_time", 10), ("deadline", 11), ("gateway", 12), ("half_open", 13),
        ];
        assert_eq!(numbers, frozen);
        let stale = Reason::new(Origin::Stale(Failure::LostTime))
            .skipped(Calltracking, Skip::Failed(Failure::Connect));
        let bits = (6 << 4) | (2 << 12) | (10 << 14) | (2 << 18);
        assert_eq!(stale.encode(), bits);
        let real = Reason::new(Origin::Upstream)
            .skipped(Anonymous, Skip::NotApplicable)
            .skipped(Calltracking, Skip::Failed(Failure::Timeout));
        let bits = 1 | (3 << 4) | (1 << 12) | ((1 | (2 << 2)) << 18);
        assert_eq!(real.encode(), bits);
    }

    /// At most two sources are above any answer: a third is not taken (its
    /// place in the order would not fit), and the two kept stay as they were.
    #[test]
    fn a_third_source_above_is_not_taken() {
        let two = Reason::new(Origin::Cache)
            .skipped(Anonymous, Skip::NoNumber)
            .skipped(Calltracking, Skip::Failed(Failure::Timeout));
        let three = two.skipped(RealPhone, Skip::NotApplicable);
        assert_eq!(three, two);
        assert_eq!(three.skips().count(), 2);
    }

    /// Every origin alone and under every one or two skips above it.
    pub(crate) fn every_reason() -> Vec<Reason> {
        let skips: Vec<Skip> = [Skip::NotApplicable, Skip::NoNumber]
            .into_iter()
            .chain(Failure::ALL.map(Skip::Failed))
            .collect();
        let origins: Vec<Origin> = [Origin::Cache, Origin::Upstream, Origin::Phone]
            .into_iter()
            .chain(Failure::ALL.map(Origin::Stale))
            .collect();
        let mut all = Vec::new();
        for &origin in &origins {
            all.push(Reason::new(origin));
            let two =
                |a, first, b, second| Reason::new(origin).skipped(a, first).skipped(b, second);
            for &first in &skips {
                for above in [Anonymous, Calltracking] {
                    all.push(Reason::new(origin).skipped(above, first));
                }
                for &second in &skips {
                    all.push(two(Anonymous, first, Calltracking, second));
                    all.push(two(RealPhone, first, Anonymous, second));
                }
            }
        }
        all
    }

    #[test]
    fn every_reason_round_trips_through_its_integer() {
        let all = every_reason();
        assert!(all.len() > 1000);
        for reason in all {
            let bits = reason.encode();
            assert!(bits < 1 << 22, "{reason:?}: {bits:#x}");
            assert_eq!(Reason::decode(bits), Some(reason), "{bits:#x}");
        }
        // Bits it never gives: an unknown failure, a source listed twice.
        assert_eq!(Reason::decode(2 << 12 | 14 << 14), None);
        assert_eq!(Reason::decode(1 | 0b0101 << 18), None);
    }

    #[test]
    fn the_code_is_the_nearest_failure_then_no_number_then_the_origin() {
        use Origin::{Cache, Phone, Upstream};
        use Skip::{Failed, NoNumber, NotApplicable as Na};
        let timeout = Failed(Failure::Timeout);
        let (connect, new) = (Failed(Failure::Connect), Reason::new);
        // Anonymous skipped first, then call-tracking.
        let two = |origin, a, c| new(origin).skipped(Anonymous, a).skipped(Calltracking, c);
        #[rustfmt::skip]
        let table = [
            (new(Cache), "cache"),
            (new(Origin::Stale(Failure::Timeout)), "stale"),
            (new(Upstream).skipped(Anonymous, Na), "upstream"),
            (two(Upstream, NoNumber, Na), "anonymous_no_number"),
            (two(Cache, NoNumber, timeout), "calltracking_timeout"),
            (two(Cache, Failed(Failure::ErrorStatus), NoNumber), "anonymous_error_status"),
            (two(Upstream, connect, Failed(Failure::CircuitOpen)), "calltracking_circuit_open"),
            (new(Phone).skipped(Calltracking, timeout), "phone_calltracking_failed"),
            (two(Phone, connect, NoNumber), "phone"),
            (new(Phone).skipped(Calltracking, Na), "phone"),
            (new(Upstream).skipped(RealPhone, Failed(Failure::Rejected)), "real_rejected"),
        ];
        for (reason, code) in table {
            assert_eq!(reason.code().as_str(), code, "{reason:?}");
        }
        // Every reason's code is one of the list, and every code is some
        // reason's.
        let seen: std::collections::HashSet<_> =
            every_reason().iter().map(|r| r.code().as_str()).collect();
        let listed: std::collections::HashSet<_> = Code::ALL.into_iter().collect();
        assert_eq!(seen, listed);
    }

    #[test]
    fn the_json_names_the_sources_above_in_order() {
        let reason = Reason::new(Origin::Stale(Failure::Deadline))
            .skipped(Calltracking, Skip::Failed(Failure::Timeout))
            .skipped(Anonymous, Skip::NotApplicable);
        assert_eq!(
            serde_json::to_string(&reason).unwrap(),
            r#"{"code":"calltracking_timeout","sources":{"calltracking":"timeout","anonymous":"not_applicable"},"origin":"stale","stood_in_for":"deadline"}"#
        );
        assert_eq!(
            serde_json::to_string(&Reason::new(Origin::Phone)).unwrap(),
            r#"{"code":"phone","sources":{},"origin":"phone"}"#
        );
    }
}
