//! A call's place in the queue (issue 27 item 2): the priority and the
//! start a task call asks for in `_meta` ([`PRIORITY_META`], [`DELAY_META`],
//! [`START_AT_META`]), checked against what its tool's config allows
//! ([`QueuePolicy`]) and its ttl. Only task calls queue: a plain call that
//! asks for either is refused.

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::BrokerError;
use crate::mcp::{DELAY_META, PRIORITY_META, START_AT_META, format_time};
use crate::tools::{QueuePolicy, describe_priority, parse_priority};

/// What a call asked for, as given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested {
    /// Its priority, if it named one.
    pub priority: Option<i64>,
    /// When it may start, if later than now.
    pub start: Option<Start>,
}

/// A start a call asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// In this many ms.
    In(i64),
    /// At this time, ms since the epoch.
    At(i64),
}

/// Where a task's job goes in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Higher runs first.
    pub priority: i64,
    /// Not before this (ms), when later than its creation.
    pub run_after: Option<i64>,
}

impl Requested {
    /// The requests of a call's `_meta`, each checked on its own (a name or
    /// a number in range; a delay of zero or more seconds; an RFC 3339
    /// time; not a delay and a time at once).
    pub fn of(meta: Option<&Value>) -> Result<Self, BrokerError> {
        let field = |key: &str| meta.and_then(|m| m.get(key)).filter(|v| !v.is_null());
        let priority = field(PRIORITY_META)
            .map(|v| parse_priority(v).map_err(|e| invalid(PRIORITY_META, &e)))
            .transpose()?;
        let start = match (field(DELAY_META), field(START_AT_META)) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(BrokerError::InvalidParams(format!(
                    "Invalid params: _meta[\"{DELAY_META}\"] and _meta[\"{START_AT_META}\"] \
                     both ask when to start; give one"
                )));
            }
            (Some(delay), None) => Some(Start::In(delay_ms(delay)?)),
            (None, Some(at)) => Some(Start::At(time_ms(at)?)),
        };
        Ok(Self { priority, start })
    }

    /// Whether it asks for anything.
    pub fn is_empty(&self) -> bool {
        self.priority.is_none() && self.start.is_none()
    }

    /// Refused for a call that runs at once (no task, so no queue).
    pub fn refuse_plain(&self, tool: &str) -> Result<(), BrokerError> {
        if self.is_empty() {
            return Ok(());
        }
        Err(BrokerError::InvalidParams(format!(
            "Invalid params: this call of '{tool}' runs at once (it is not a task), so it has no \
             place in the queue: {PRIORITY_META}, {DELAY_META} and {START_AT_META} go with task \
             calls only"
        )))
    }

    /// Its place in the queue at `now`, for a tool with `policy` and a task
    /// kept `ttl_ms`: refused above the tool's `max_priority`, past its
    /// `max_delay`, or at or past the task's expiry.
    pub fn place(
        &self,
        tool: &str,
        policy: &QueuePolicy,
        ttl_ms: Option<i64>,
        now: i64,
    ) -> Result<Placement, BrokerError> {
        let priority = self.priority.unwrap_or(policy.priority);
        if priority > policy.max_priority {
            return Err(BrokerError::InvalidParams(format!(
                "Invalid params: priority {} is above what tool '{tool}' allows (max_priority {})",
                describe_priority(priority),
                describe_priority(policy.max_priority)
            )));
        }
        let run_after = match self.start {
            None => None,
            Some(Start::In(ms)) => Some(now.saturating_add(ms)),
            Some(Start::At(at)) => Some(at),
        }
        .filter(|at| *at > now);
        if let Some(at) = run_after {
            let delay = at - now;
            let max = i64::try_from(policy.max_delay.as_millis()).unwrap_or(i64::MAX);
            if delay > max {
                return Err(BrokerError::InvalidParams(format!(
                    "Invalid params: a start at {} is {} ahead, beyond what tool '{tool}' allows \
                     (max_delay {})",
                    format_time(at),
                    seconds(delay),
                    seconds(max)
                )));
            }
            if let Some(ttl) = ttl_ms
                && delay >= ttl
            {
                return Err(BrokerError::InvalidParams(format!(
                    "Invalid params: a start at {} is {} ahead, but the task is kept {} (its ttl) \
                     and would be gone before it started; ask for a longer task.ttl",
                    format_time(at),
                    seconds(delay),
                    seconds(ttl)
                )));
            }
        }
        Ok(Placement {
            priority,
            run_after,
        })
    }
}

fn invalid(key: &str, why: &str) -> BrokerError {
    BrokerError::InvalidParams(format!("Invalid params: _meta[\"{key}\"]: {why}"))
}

/// A delay in seconds (a number, zero or more), in ms.
fn delay_ms(value: &Value) -> Result<i64, BrokerError> {
    match value.as_f64() {
        Some(s) if s.is_finite() && s >= 0.0 && s * 1000.0 < i64::MAX as f64 => {
            Ok((s * 1000.0).round() as i64)
        }
        _ => Err(invalid(
            DELAY_META,
            &format!("{value} is not a delay: give seconds, zero or more"),
        )),
    }
}

/// An RFC 3339 time, in ms since the epoch.
fn time_ms(value: &Value) -> Result<i64, BrokerError> {
    let parsed = value
        .as_str()
        .and_then(|text| OffsetDateTime::parse(text, &Rfc3339).ok());
    match parsed {
        Some(at) => i64::try_from(at.unix_timestamp_nanos() / 1_000_000)
            .map_err(|_| invalid(START_AT_META, "out of range")),
        None => Err(invalid(
            START_AT_META,
            &format!("{value} is not an RFC 3339 time (such as \"2026-12-04T10:00:00Z\")"),
        )),
    }
}

/// ms as seconds for messages (`90 s`, `1.5 s`).
fn seconds(ms: i64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.3} s", ms as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn policy() -> QueuePolicy {
        QueuePolicy {
            priority: 0,
            max_priority: 10,
            max_delay: Duration::from_secs(3600),
        }
    }

    fn message(e: BrokerError) -> String {
        match e {
            BrokerError::InvalidParams(m) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_call_is_placed_within_its_tool_and_ttl() {
        let asked = Requested::of(Some(&json!({ PRIORITY_META: "high", DELAY_META: 30 }))).unwrap();
        let placed = asked.place("t", &policy(), Some(60_000), NOW).unwrap();
        assert_eq!(placed.priority, 10);
        assert_eq!(placed.run_after, Some(NOW + 30_000));
        let none = Requested::of(None).unwrap();
        assert!(none.is_empty());
        assert_eq!(
            none.place("t", &policy(), None, NOW).unwrap(),
            Placement {
                priority: 0,
                run_after: None
            }
        );
        // A time already past starts now.
        let past = Requested::of(Some(&json!({ START_AT_META: "2020-01-01T00:00:00Z" }))).unwrap();
        assert_eq!(
            past.place("t", &policy(), None, NOW).unwrap().run_after,
            None
        );
    }

    #[test]
    fn what_the_tool_or_the_ttl_does_not_allow_is_refused_by_name() {
        let too_high = Requested::of(Some(&json!({ PRIORITY_META: "highest" }))).unwrap();
        let m = message(too_high.place("t", &policy(), None, NOW).unwrap_err());
        assert!(m.contains("highest (20)") && m.contains("high (10)"), "{m}");
        let too_far = Requested::of(Some(&json!({ DELAY_META: 7200 }))).unwrap();
        let m = message(too_far.place("t", &policy(), None, NOW).unwrap_err());
        assert!(m.contains("max_delay 3600 s"), "{m}");
        let past_ttl = Requested::of(Some(&json!({ DELAY_META: 60 }))).unwrap();
        let m = message(
            past_ttl
                .place("t", &policy(), Some(60_000), NOW)
                .unwrap_err(),
        );
        assert!(m.contains("ttl"), "{m}");
        for bad in [
            json!({ DELAY_META: -1 }),
            json!({ DELAY_META: "10" }),
            json!({ START_AT_META: "tomorrow" }),
            json!({ PRIORITY_META: "urgent" }),
            json!({ DELAY_META: 1, START_AT_META: "2030-01-01T00:00:00Z" }),
        ] {
            assert!(Requested::of(Some(&bad)).is_err(), "{bad}");
        }
        let plain = Requested::of(Some(&json!({ DELAY_META: 1 }))).unwrap();
        assert!(plain.refuse_plain("t").is_err());
    }
}
