//! `taskbroker prune`: the purge of tasks past their ttl, with their
//! retention rules, run now from the command line (brokers run it every
//! few seconds), or with `--dry-run` a report of what it would delete,
//! archive or keep, changing nothing.

use std::collections::BTreeMap;

use clap::Args;
use serde_json::{Value, json};

use super::{DbArg, failed, open, print_json, table};
use crate::broker::maintenance::purge_until_done;
use crate::client::EXIT_OK;
use crate::clock::now_ms;
use crate::defaults;
use crate::mcp::format_time;
use crate::store::{Fate, Store, retention::fate};

/// `taskbroker prune`.
#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    /// The database.
    #[command(flatten)]
    pub db: DbArg,
    /// Say what would be deleted, archived or kept, by tool and status;
    /// change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `taskbroker prune`; the exit code.
pub async fn run(args: PruneArgs) -> u8 {
    let store = match open(&args.db.db).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let done = if args.dry_run {
        dry_run(&store, args.json).await
    } else {
        prune(&store, args.json).await
    };
    store.close().await;
    done
}

/// Purge passes until one finds less than a full batch.
async fn prune(store: &Store, json: bool) -> u8 {
    let total = match purge_until_done(store, defaults::PURGE_BATCH, |_| {}).await {
        Ok(total) => total,
        Err(e) => return failed(&format!("prune: {e}")),
    };
    if json {
        return print_json(&json!({
            "deleted": total.deleted,
            "archived": total.archived,
            "kept": total.kept,
        }));
    }
    println!(
        "{} deleted, {} archived, {} kept past their ttl by a retention rule",
        total.deleted, total.archived, total.kept
    );
    EXIT_OK
}

/// What a purge now would do, by tool, status and fate.
#[derive(Debug, Default)]
struct Group {
    tasks: u64,
    /// The span of `keep_until` of kept tasks.
    until: Option<(i64, i64)>,
}

async fn dry_run(store: &Store, json: bool) -> u8 {
    let now = now_ms();
    let mut groups: BTreeMap<(String, String, &'static str), Group> = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = match store
            .task_purge_candidates(now, after, defaults::PURGE_BATCH)
            .await
        {
            Ok(page) => page,
            Err(e) => return failed(&format!("prune: {e}")),
        };
        let Some(last) = page.last() else { break };
        after = last.seq;
        for task in &page {
            let (action, until) = match fate(task, now) {
                Fate::Keep { until } => ("keep", Some(until)),
                Fate::Archive => ("archive", None),
                Fate::Delete => ("delete", None),
            };
            let group = groups
                .entry((task.tool.clone(), task.status.clone(), action))
                .or_default();
            group.tasks += 1;
            if let Some(at) = until {
                group.until = Some(
                    group
                        .until
                        .map_or((at, at), |(a, b)| (a.min(at), b.max(at))),
                );
            }
        }
    }
    if json {
        let rows = groups
            .iter()
            .map(|((tool, status, action), g)| {
                json!({
                    "tool": tool,
                    "status": status,
                    "action": action,
                    "tasks": g.tasks,
                    "keepUntil": g.until.map(|(from, to)| json!([format_time(from), format_time(to)])),
                })
            })
            .collect();
        return print_json(&Value::Array(rows));
    }
    if groups.is_empty() {
        println!("nothing past its ttl: a prune now would change nothing");
        return EXIT_OK;
    }
    let mut rows = vec![vec![
        "tool".into(),
        "status".into(),
        "would".into(),
        "tasks".into(),
        "kept until".into(),
    ]];
    for ((tool, status, action), g) in &groups {
        let until = match g.until {
            Some((from, to)) if from == to => format_time(from),
            Some((from, to)) => format!("{} .. {}", format_time(from), format_time(to)),
            None => String::new(),
        };
        rows.push(vec![
            tool.clone(),
            status.clone(),
            (*action).into(),
            g.tasks.to_string(),
            until,
        ]);
    }
    print!("{}", table(&rows, &[3]));
    println!("dry run: nothing was changed");
    EXIT_OK
}
