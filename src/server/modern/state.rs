//! The `requestState` of MCP 2026-07-28 multi-round calls: what a retry
//! needs from earlier rounds (the answers given so far), carried by the
//! client and signed by this process, so a tampered or foreign state is
//! refused instead of trusted.
//!
//! The key is drawn at start: a state outlives neither a restart nor a
//! move to another broker process. A retry with such a state is refused
//! with a message that says to call again without it; the call then asks
//! again from the first question.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Version tag of the state format.
const FORMAT: u64 = 1;

/// Signs and checks request states.
pub struct StateKey([u8; 32]);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(..)")
    }
}

/// Why a requestState was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    /// Not of our making, altered, or signed by another process.
    #[error(
        "Invalid params: requestState failed its integrity check (altered, or issued by another \
         broker process or before a restart); call again without requestState and inputResponses"
    )]
    Tampered,
    /// Signed by us for another method or tool.
    #[error("Invalid params: requestState belongs to another request ({0})")]
    OtherRequest(String),
}

impl StateKey {
    /// A fresh random key.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        Ok(Self(key))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts a 32-byte key"),
        }
    }

    /// The state for a retry of `target` (e.g. `tools/call:greet`) that
    /// already has `answers`.
    pub fn sign(&self, target: &str, answers: &Map<String, Value>) -> String {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let payload = json!({ "v": FORMAT, "for": target, "answers": answers, "nonce": nonce });
        let payload = URL_SAFE_NO_PAD.encode(payload.to_string());
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{payload}.{tag}")
    }

    /// The answers a state carries, after checking its signature and that
    /// it was made for `target`.
    pub fn open(&self, target: &str, state: &str) -> Result<Map<String, Value>, StateError> {
        let (payload, tag) = state.split_once('.').ok_or(StateError::Tampered)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| StateError::Tampered)?;
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        mac.verify_slice(&tag).map_err(|_| StateError::Tampered)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| StateError::Tampered)?;
        let payload: Value = serde_json::from_slice(&payload).map_err(|_| StateError::Tampered)?;
        if payload.get("v").and_then(Value::as_u64) != Some(FORMAT) {
            return Err(StateError::Tampered);
        }
        let made_for = payload.get("for").and_then(Value::as_str).unwrap_or("");
        if made_for != target {
            return Err(StateError::OtherRequest(made_for.to_owned()));
        }
        match payload.get("answers") {
            Some(Value::Object(answers)) => Ok(answers.clone()),
            _ => Err(StateError::Tampered),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers() -> Map<String, Value> {
        let mut a = Map::new();
        a.insert(
            "step1".into(),
            json!({ "action": "accept", "content": { "name": "Alice" } }),
        );
        a
    }

    #[test]
    fn a_signed_state_opens_with_its_answers() {
        let key = StateKey::random().unwrap();
        let state = key.sign("tools/call:t", &answers());
        assert_eq!(key.open("tools/call:t", &state).unwrap(), answers());
    }

    #[test]
    fn every_state_differs_even_with_the_same_answers() {
        let key = StateKey::random().unwrap();
        assert_ne!(key.sign("x", &answers()), key.sign("x", &answers()));
    }

    #[test]
    fn altered_foreign_or_misdirected_states_are_refused() {
        let key = StateKey::random().unwrap();
        let state = key.sign("tools/call:t", &answers());
        let tampered = format!("{state}-TAMPERED");
        assert_eq!(
            key.open("tools/call:t", &tampered),
            Err(StateError::Tampered)
        );
        assert_eq!(
            key.open("tools/call:t", "garbage"),
            Err(StateError::Tampered)
        );
        let other = StateKey::random().unwrap();
        assert_eq!(
            other.open("tools/call:t", &state),
            Err(StateError::Tampered)
        );
        assert!(matches!(
            key.open("tools/call:u", &state),
            Err(StateError::OtherRequest(_))
        ));
    }
}
