//! The `requestState` of MCP 2026-07-28 multi-round calls: what a retry
//! needs from earlier rounds (the answers given so far), carried by the
//! client and signed with a key every broker on the database shares
//! ([`crate::broker::keys`]), so a retry may reach any broker process, or
//! this one after a restart, and a tampered or foreign state is refused
//! instead of trusted.
//!
//! A state is `{epoch}.{payload}.{tag}`: the key's period, the base64url
//! JSON payload, and the HMAC-SHA256 of `{epoch}.{payload}`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use crate::broker::keys::SigningKey;

type HmacSha256 = Hmac<Sha256>;

/// Version tag of the state format (1 was signed with a per-process key).
const FORMAT: u64 = 2;

/// Why a requestState was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    /// Not of our making, or altered.
    #[error(
        "Invalid params: requestState failed its integrity check (altered, or not issued by a \
         broker on this database); call again without requestState and inputResponses"
    )]
    Tampered,
    /// Signed with a key that has rotated out.
    #[error(
        "Invalid params: requestState has expired ({0}); call again without requestState and \
         inputResponses"
    )]
    Expired(String),
    /// Signed by us for another method or tool.
    #[error("Invalid params: requestState belongs to another request ({0})")]
    OtherRequest(String),
}

fn mac(key: &SigningKey, epoch_and_payload: &str) -> HmacSha256 {
    // HMAC takes keys of any length.
    let mut mac = match HmacSha256::new_from_slice(key.secret.as_slice()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts a 32-byte key"),
    };
    mac.update(epoch_and_payload.as_bytes());
    mac
}

/// The state for a retry of `target` (e.g. `tools/call:greet`) that
/// already has `answers`.
pub fn sign(key: &SigningKey, target: &str, answers: &Map<String, Value>) -> String {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let payload = json!({ "v": FORMAT, "for": target, "answers": answers, "nonce": nonce });
    let signed = format!(
        "{}.{}",
        key.epoch,
        URL_SAFE_NO_PAD.encode(payload.to_string())
    );
    let tag = URL_SAFE_NO_PAD.encode(mac(key, &signed).finalize().into_bytes());
    format!("{signed}.{tag}")
}

/// The key period a state names (which key to fetch before [`open`]).
pub fn epoch(state: &str) -> Result<i64, StateError> {
    let (epoch, _) = state.split_once('.').ok_or(StateError::Tampered)?;
    epoch.parse().map_err(|_| StateError::Tampered)
}

/// The answers a state carries, after checking its signature with `key`
/// (the key of the state's [`epoch`]) and that it was made for `target`.
pub fn open(key: &SigningKey, target: &str, state: &str) -> Result<Map<String, Value>, StateError> {
    let (signed, tag) = state.rsplit_once('.').ok_or(StateError::Tampered)?;
    let (epoch, payload) = signed.split_once('.').ok_or(StateError::Tampered)?;
    if epoch.parse::<i64>() != Ok(key.epoch) {
        return Err(StateError::Tampered);
    }
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| StateError::Tampered)?;
    mac(key, signed)
        .verify_slice(&tag)
        .map_err(|_| StateError::Tampered)?;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn key(epoch: i64, byte: u8) -> SigningKey {
        SigningKey {
            epoch,
            secret: Arc::new([byte; crate::broker::keys::KEY_BYTES]),
        }
    }

    fn answers() -> Map<String, Value> {
        let mut a = Map::new();
        a.insert(
            "step1".into(),
            json!({ "action": "accept", "content": { "name": "Alice" } }),
        );
        a
    }

    #[test]
    fn a_signed_state_names_its_epoch_and_opens_with_its_answers() {
        let k = key(20_000, 7);
        let state = sign(&k, "tools/call:t", &answers());
        assert_eq!(epoch(&state), Ok(20_000));
        assert_eq!(open(&k, "tools/call:t", &state).unwrap(), answers());
    }

    #[test]
    fn every_state_differs_even_with_the_same_answers() {
        let k = key(1, 7);
        assert_ne!(sign(&k, "x", &answers()), sign(&k, "x", &answers()));
    }

    #[test]
    fn altered_foreign_relabelled_or_misdirected_states_are_refused() {
        let k = key(5, 7);
        let state = sign(&k, "tools/call:t", &answers());
        let tampered = format!("{state}-TAMPERED");
        assert_eq!(
            open(&k, "tools/call:t", &tampered),
            Err(StateError::Tampered)
        );
        assert_eq!(
            open(&k, "tools/call:t", "garbage"),
            Err(StateError::Tampered)
        );
        assert_eq!(epoch("garbage"), Err(StateError::Tampered));
        assert_eq!(
            open(&key(5, 8), "tools/call:t", &state),
            Err(StateError::Tampered)
        );
        // The epoch is signed: moving a state to another key's period fails.
        let relabelled = state.replacen("5.", "6.", 1);
        assert_eq!(
            open(&key(6, 7), "tools/call:t", &relabelled),
            Err(StateError::Tampered)
        );
        assert!(matches!(
            open(&k, "tools/call:u", &state),
            Err(StateError::OtherRequest(_))
        ));
    }
}
