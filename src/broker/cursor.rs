//! tasks/list cursors: opaque to clients (T-17), made from the row key.
//!
//! Layout before base64url (no padding): one version byte (1), the row key
//! `seq` as 8 bytes big-endian, and an 8-byte FNV-1a tag of the owner, so a
//! cursor from another session or principal is refused (-32602) rather than
//! quietly paging someone else's order.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

const VERSION: u8 = 1;
const LEN: usize = 17;

fn owner_tag(owner: &str) -> u64 {
    // FNV-1a, 64 bit: stable across builds and platforms.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in owner.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The cursor that continues after row `seq` for `owner`.
pub fn encode(seq: i64, owner: &str) -> String {
    let mut bytes = [0u8; LEN];
    bytes[0] = VERSION;
    bytes[1..9].copy_from_slice(&seq.to_be_bytes());
    bytes[9..17].copy_from_slice(&owner_tag(owner).to_be_bytes());
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The row key in a cursor made for `owner`, or None when the cursor is not
/// one of ours, not this owner's, or damaged.
pub fn decode(cursor: &str, owner: &str) -> Option<i64> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    if bytes.len() != LEN || bytes[0] != VERSION {
        return None;
    }
    let seq = i64::from_be_bytes(bytes[1..9].try_into().ok()?);
    let tag = u64::from_be_bytes(bytes[9..17].try_into().ok()?);
    (tag == owner_tag(owner) && seq > 0).then_some(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t17_round_trip_and_t19_rejects_foreign_or_damaged() {
        let c = encode(42, "session:a");
        assert_eq!(decode(&c, "session:a"), Some(42));
        assert_eq!(decode(&c, "session:b"), None);
        assert_eq!(decode("", "session:a"), None);
        assert_eq!(decode("not base64!", "session:a"), None);
        assert_eq!(decode(&c[..c.len() - 1], "session:a"), None);
        assert_eq!(decode(&encode(0, "session:a"), "session:a"), None);
    }
}
