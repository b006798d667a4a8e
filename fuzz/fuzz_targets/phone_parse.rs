//! `Phone::parse` never panics; what it accepts round-trips and masks cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phones_gateway::domain::Phone;

fuzz_target!(|input: &str| {
    if let Ok(phone) = Phone::parse(input) {
        let text = phone.to_string();
        assert_eq!(
            Phone::parse(&text),
            Ok(phone),
            "normal form re-parses to itself"
        );
        assert_eq!(Phone::from_u64(phone.to_u64()), Some(phone));
        let masked = phone.masked().to_string();
        assert_eq!(masked.len(), text.len());
        assert_eq!(masked[masked.len() - 2..], text[text.len() - 2..]);
        assert!(!masked[1..masked.len() - 2].contains(|c: char| c.is_ascii_digit()));
    }
});
