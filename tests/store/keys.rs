//! The keys that sign request states (`KeyStore`): shared by processes,
//! rotated by period, purged.

use super::*;

/// Issue 23: the keys that sign MCP 2026-07-28 request states live in the
/// database. Two processes (two handles, two `SigningKeys`) asking at once
/// for this period's key get the same one, made once; a state of the
/// previous period is still accepted, an older one is not; the purge
/// deletes exactly the keys no state may use (a period later than this
/// clock stops accepting them), and a process that never cached such a key
/// can no longer read it.
async fn request_state_keys_are_shared_rotated_and_purged(db: TestDb) {
    use taskbroker::broker::keys::{KeyError, SigningKeys};
    const PERIOD: i64 = 3_600_000;
    let other = store::open(&db.fresh.location, Durability::Full)
        .await
        .unwrap();
    let here = SigningKeys::with_period(db.store.clone(), PERIOD);
    let there = SigningKeys::with_period(other.clone(), PERIOD);
    let now = 10 * PERIOD + 5;
    let (a, b) = tokio::join!(here.current(now), there.current(now));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "both processes sign with the key made once");
    assert_eq!(a.epoch, 10);
    assert_eq!(here.current(now + 1).await.unwrap(), a, "same period");

    // The next period has a key of its own; the previous one still opens.
    let later = now + PERIOD;
    let next = there.current(later).await.unwrap();
    assert_eq!(next.epoch, 11);
    assert_ne!(next.secret, a.secret);
    assert_eq!(here.for_epoch(10, later).await.unwrap(), a);
    assert_eq!(here.for_epoch(11, later).await.unwrap(), next);
    // Two periods on, the first key is refused even where it is cached.
    let much_later = now + 2 * PERIOD;
    assert!(matches!(
        here.for_epoch(10, much_later).await,
        Err(KeyError::Expired(1))
    ));
    // A period no process ever signed in has no key to open with.
    assert!(matches!(
        here.for_epoch(12, much_later).await,
        Err(KeyError::Expired(_))
    ));

    // A period is kept beyond what this clock accepts (for a clock ahead).
    assert_eq!(
        here.purge(much_later).await.unwrap(),
        0,
        "epoch 10 is kept a period more"
    );
    let purged = here.purge(much_later + PERIOD).await.unwrap();
    assert_eq!(purged, 1, "then only epoch 10 is past use");
    let fresh_process = SigningKeys::with_period(other, PERIOD);
    assert_eq!(fresh_process.for_epoch(11, much_later).await.unwrap(), next);
    assert!(matches!(
        fresh_process.for_epoch(10, later).await,
        Err(KeyError::Expired(_))
    ));
}
store_test!(request_state_keys_are_shared_rotated_and_purged);
