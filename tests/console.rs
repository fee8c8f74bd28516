//! The web console at `/ui` through the real binary: who may open it (an
//! operator token, or nobody-but-loopback without tokens), what its JSON
//! says after a known workload (it must agree with MCP and the rows), the
//! cancel button's endpoint, the live event stream, and the pages in a real
//! browser (Debian's chromium driven by `tests/console/browser.mjs`).
//!
//! The browser test needs `node` and `/usr/bin/chromium` (`CHROMIUM`
//! elsewhere); it installs `tests/console/node_modules` with `npm ci` when
//! missing. Without a browser it is skipped with one line on stderr, unless
//! `TASKBROKER_REQUIRE_BROWSER=1` (CI sets it): then it fails.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, Driver, Server, WorkerProc, create_token};
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use serde_json::{Value, json};

/// `http://127.0.0.1:PORT` of a server.
fn base(server: &Server) -> String {
    server.url.trim_end_matches("/mcp").to_owned()
}

/// An HTTP client that does not follow redirects (the login answers 303).
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// GET `path` with `token` as a bearer: (status, body).
async fn get(server: &Server, path: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = http().get(format!("{}{path}", base(server)));
    if let Some(t) = token {
        req = req.header(AUTHORIZATION, format!("Bearer {t}"));
    }
    let r = req.send().await.unwrap();
    (r.status(), r.text().await.unwrap())
}

/// GET JSON that must be 200.
async fn get_json(server: &Server, path: &str, token: Option<&str>) -> Value {
    let (status, body) = get(server, path, token).await;
    assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// POST the console's cancel: (status, JSON body).
async fn cancel(server: &Server, task_id: &str, token: &str) -> (StatusCode, Value) {
    let r = http()
        .post(format!("{}/ui/api/tasks/{task_id}/cancel", base(server)))
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header(CONTENT_TYPE, "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// A 2025-11-25 session of `token`'s principal.
async fn session(server: &Server, token: &str) -> Client {
    let mut c = Client::new(&server.url);
    c.token = Some(token.to_owned());
    c.initialize().await;
    c
}

/// Every task id of a filtered listing, walking its pages of `limit`.
async fn all_pages(server: &Server, query: &str, limit: usize, token: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let cursor = before.map(|b| format!("&before={b}")).unwrap_or_default();
        let page = get_json(
            server,
            &format!("/ui/api/tasks?limit={limit}&{query}{cursor}"),
            Some(token),
        )
        .await;
        let tasks = page["tasks"].as_array().unwrap();
        assert!(tasks.len() <= limit);
        ids.extend(
            tasks
                .iter()
                .map(|t| t["taskId"].as_str().unwrap().to_owned()),
        );
        match page["nextBefore"].as_i64() {
            Some(b) => before = Some(b),
            None => return ids,
        }
    }
}

/// Operators only, when tokens exist: 401 without a token, 403 for a
/// principal's token, 200 for an operator's; the login form turns an
/// operator token into an HttpOnly cookie; Origin and Host are checked.
async fn operator_token_opens_the_console(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let ops = create_token(&server, "ops", &["--operator"]);
    let alice = create_token(&server, "alice", &[]);

    let (status, body) = get(&server, "/ui", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("name=\"token\""), "the login form: {body}");
    assert!(
        body.contains("--operator"),
        "says how to get a token: {body}"
    );
    let (status, body) = get(&server, "/ui/api/overview", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string());

    for path in ["/ui", "/ui/tasks", "/ui/api/overview", "/ui/api/events"] {
        let (status, body) = get(&server, path, Some(&alice)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(
            body.contains("alice") && body.contains("is not an operator token"),
            "{path}: {body}"
        );
    }
    let (status, _) = get(&server, "/ui/api/overview", Some("tbk_nope_nope")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = get(&server, "/ui/tasks/x", Some(&ops)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("/ui/assets/console.js"), "{body}");

    // The login form.
    let login = |token: &str| {
        http()
            .post(format!("{}/ui/login", base(&server)))
            .form(&[("token", token)])
            .send()
    };
    let r = login(&alice).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("not an operator token"));
    let r = login("garbage").await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = login(&ops).await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/ui");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let r = http()
        .get(format!("{}/ui/api/meta", base(&server)))
        .header(COOKIE, &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let meta: Value = r.json().await.unwrap();
    assert_eq!(meta["principal"], "ops");
    assert_eq!(meta["tokens"], true);
    assert!(meta["tools"].as_array().unwrap().contains(&json!("sleep")));
    let r = http()
        .post(format!("{}/ui/logout", base(&server)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );

    // A revoked operator token opens nothing.
    let id = ops.strip_prefix("tbk_").unwrap().split('_').next().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["token", "revoke", id, "--db", &server.db_arg()])
        .env_remove("TASKBROKER_DB")
        .output()
        .unwrap();
    assert!(out.status.success());
    let (status, _) = get(&server, "/ui/api/overview", Some(&ops)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Cross-site requests and tokens in URLs are refused.
    let ops = create_token(&server, "ops", &["--operator"]);
    let r = http()
        .get(format!("{}/ui/api/overview", base(&server)))
        .header(AUTHORIZATION, format!("Bearer {ops}"))
        .header(ORIGIN, "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let (status, _) = get(&server, &format!("/ui/api/overview?token={ops}"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
both_drivers!(operator_token_opens_the_console);

/// Without tokens the console is served on a loopback listener only.
async fn without_tokens_only_on_loopback(driver: Driver) {
    let local = Server::start_on(driver, &[]);
    let (status, _) = get(&local, "/ui", None).await;
    assert_eq!(status, StatusCode::OK);
    let meta = get_json(&local, "/ui/api/meta", None).await;
    assert_eq!(meta["tokens"], false);
    assert_eq!(
        meta["database"],
        if driver == Driver::Sqlite {
            "sqlite"
        } else {
            "postgres"
        }
    );
    // DNS rebinding: a page on another name that resolves here.
    let r = http()
        .get(format!("{}/ui/api/overview", base(&local)))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // A reverse proxy on this machine would make anyone a local user.
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9"),
        ("x-real-ip", "203.0.113.9"),
    ] {
        let r = http()
            .get(format!("{}/ui/api/overview", base(&local)))
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{name}");
        assert!(r.text().await.unwrap().contains("came through a proxy"));
    }

    let open = Server::start_on(driver, &["--listen", "0.0.0.0:0"]);
    for path in ["/ui", "/ui/api/overview", "/ui/api/events"] {
        let (status, body) = get(&open, path, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert!(
            body.contains("only on a loopback listen address")
                && body.contains("token create --principal ops --operator"),
            "{path}: {body}"
        );
    }
}
both_drivers!(without_tokens_only_on_loopback);

/// On a broker reached by another name than loopback (here `0.0.0.0`),
/// the login form and cancels of the console's own pages pass the Origin
/// check (their Origin names the Host they went to); another site's page
/// cannot log in, log out or cancel.
async fn the_consoles_own_site_may_post_others_may_not(driver: Driver) {
    let server = Server::start_on(driver, &["--listen", "0.0.0.0:0"]);
    let ops = create_token(&server, "ops", &["--operator"]);
    let host = base(&server).trim_start_matches("http://").to_owned();
    let post = |path: &str, origin: &str| {
        http()
            .post(format!("{}{path}", base(&server)))
            .header(ORIGIN, origin.to_owned())
            .form(&[("token", ops.as_str())])
            .send()
    };
    let r = post("/ui/login", &format!("http://{host}")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "own site logs in");
    for path in ["/ui/login", "/ui/logout"] {
        let r = post(path, "https://evil.example").await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
    }
    let r = post("/ui/logout", &format!("http://{host}")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "own site logs out");
    let r = http()
        .post(format!("{}/ui/api/tasks/x/cancel", base(&server)))
        .header(AUTHORIZATION, format!("Bearer {ops}"))
        .header(ORIGIN, "https://evil.example")
        .header(CONTENT_TYPE, "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = http()
        .post(format!("{}/ui/api/tasks/x/cancel", base(&server)))
        .header(AUTHORIZATION, format!("Bearer {ops}"))
        .header(ORIGIN, format!("http://{host}"))
        .header(CONTENT_TYPE, "Application/JSON")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "own site reaches the cancel"
    );
}
both_drivers!(the_consoles_own_site_may_post_others_may_not);

/// After a known workload by two principals (one task of each outcome, a
/// worker process beside the embedded pool), the console's JSON agrees with
/// what MCP says: counts by tool, every principal's tasks, filters, keyset
/// pages, one task's whole history; its cancel ends a running task, which
/// the owner then sees cancelled; refusals are precise.
async fn console_json_agrees_with_the_workload(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let _worker = WorkerProc::start(&server, 1, &[]);
    let ops = create_token(&server, "ops", &["--operator"]);
    let alice_token = create_token(&server, "alice", &[]);
    let bob_token = create_token(&server, "bob", &[]);
    let mut alice = session(&server, &alice_token).await;
    let mut bob = session(&server, &bob_token).await;

    let mut done = Vec::new();
    for _ in 0..3 {
        let t = alice.call_task("sleep", json!({ "seconds": 0.05 })).await;
        done.push(t["taskId"].as_str().unwrap().to_owned());
    }
    let failed = bob.call_task("fail", json!({})).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    for id in done.iter().chain([&failed]) {
        let owner = if *id == failed { &mut bob } else { &mut alice };
        owner.wait_terminal(id, Duration::from_secs(30)).await;
    }
    let running = alice.call_task("sleep", json!({ "seconds": 600 })).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    // Wait until it runs (its first progress report).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = get_json(&server, &format!("/ui/api/tasks/{running}"), Some(&ops)).await;
        if !h["progress"].as_array().unwrap().is_empty() {
            assert_eq!(h["job"]["state"], "running");
            break;
        }
        assert!(Instant::now() < deadline, "never ran: {h}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let o = get_json(&server, "/ui/api/overview", Some(&ops)).await;
    let tool = |name: &str| {
        o["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tool"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {name}: {o}"))
    };
    assert_eq!(tool("sleep")["finishedLastHour"], 3, "{o}");
    assert_eq!(tool("sleep")["running"], 1, "{o}");
    assert_eq!(tool("sleep")["queued"], 0, "{o}");
    assert_eq!(tool("fail")["failedLastHour"], 1, "{o}");
    assert_eq!(tool("fail")["finishedLastHour"], 1, "{o}");
    assert!(
        tool("fail")["lastFailure"]
            .as_str()
            .unwrap()
            .contains("the fail tool failed"),
        "{o}"
    );
    assert_eq!(
        tool("echo")["finishedLastHour"],
        0,
        "every served tool has a row"
    );
    assert_eq!(o["open"]["working"], 1);
    assert_eq!(o["finished"]["completed"]["lastHour"], 3);
    assert_eq!(o["finished"]["failed"]["lastHour"], 1);
    let workers = o["workers"].as_array().unwrap();
    let live: Vec<&Value> = workers.iter().filter(|w| w["state"] == "live").collect();
    assert_eq!(
        live.len(),
        2,
        "the embedded pool and the worker process: {o}"
    );
    assert!(live.iter().any(|w| w["kind"] == "process"));
    assert_eq!(
        live.iter()
            .map(|w| w["jobsRunning"].as_i64().unwrap())
            .sum::<i64>(),
        1
    );

    // Every principal's tasks, newest first; filters; pages.
    let all = all_pages(&server, "", 50, &ops).await;
    let mut expected: Vec<String> = done.to_vec();
    expected.push(failed.clone());
    expected.push(running.clone());
    expected.reverse();
    assert_eq!(all, expected);
    assert_eq!(all_pages(&server, "", 1, &ops).await, expected);
    assert_eq!(
        all_pages(&server, "status=failed", 2, &ops).await,
        std::slice::from_ref(&failed)
    );
    assert_eq!(
        all_pages(&server, "status=working,failed", 2, &ops).await,
        [running.clone(), failed.clone()]
    );
    // Unfinished statuses only: found by their index, not by walking.
    assert_eq!(
        all_pages(&server, "status=working", 1, &ops).await,
        std::slice::from_ref(&running)
    );
    assert!(
        all_pages(&server, "status=input_required", 50, &ops)
            .await
            .is_empty()
    );
    assert_eq!(
        all_pages(
            &server,
            "status=working,input_required&tool=sleep",
            50,
            &ops
        )
        .await,
        std::slice::from_ref(&running)
    );
    assert_eq!(
        all_pages(&server, "tool=fail", 2, &ops).await,
        std::slice::from_ref(&failed)
    );
    assert_eq!(
        all_pages(&server, "owner=principal:alice&tool=sleep", 2, &ops)
            .await
            .len(),
        4
    );
    for (query, needle) in [
        ("status=bogus", "unknown status 'bogus'"),
        ("before=-3", "'before' must be a positive row key"),
        ("limit=1000", "'limit' must be 1 to 200"),
    ] {
        let (status, body) = get(&server, &format!("/ui/api/tasks?{query}"), Some(&ops)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(body.contains(needle), "{query}: {body}");
    }

    // One task's story.
    let h = get_json(&server, &format!("/ui/api/tasks/{failed}"), Some(&ops)).await;
    assert_eq!(h["task"]["owner"], "principal:bob");
    assert_eq!(h["task"]["tool"], "fail");
    assert_eq!(h["task"]["status"], "failed");
    assert_eq!(h["task"]["result"]["isError"], true);
    let steps: Vec<(Value, Value)> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["from"].clone(), e["to"].clone()))
        .collect();
    assert_eq!(
        steps,
        [
            (Value::Null, json!("working")),
            (json!("working"), json!("failed"))
        ]
    );
    let job_events: Vec<&str> = h["jobEvents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(job_events, ["claimed", "finished"]);
    assert_eq!(h["job"]["attempt"], 1);
    let (status, _) = get(&server, "/ui/api/tasks/no-such-task", Some(&ops)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The cancel button's endpoint: an operator cancels alice's task.
    let r = http()
        .post(format!("{}/ui/api/tasks/{running}/cancel", base(&server)))
        .header(AUTHORIZATION, format!("Bearer {ops}"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "CSRF guard");
    let (status, body) = cancel(&server, &running, &alice_token).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = cancel(&server, &running, &ops).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["task"]["status"], "cancelled");
    let seen = alice.ok("tasks/get", json!({ "taskId": running })).await;
    assert_eq!(seen["status"], "cancelled");
    let (status, body) = cancel(&server, &running, &ops).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("already cancelled")
    );
    let (status, _) = cancel(&server, "no-such-task", &ops).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let h = get_json(&server, &format!("/ui/api/tasks/{running}"), Some(&ops)).await;
    assert_eq!(
        h["events"].as_array().unwrap().last().unwrap()["to"],
        "cancelled"
    );
    let lines = server.log();
    assert!(
        lines.contains("by an operator, in the console") && lines.contains("ops"),
        "the cancel is audited"
    );
}
both_drivers!(console_json_agrees_with_the_workload);

/// `/ui/api/events` streams every principal's status changes and progress
/// as they are committed, by any process, in batches (`changes` events).
async fn events_stream_the_change_feed(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let _worker = WorkerProc::start(&server, 1, &[]);
    let ops = create_token(&server, "ops", &["--operator"]);
    let alice_token = create_token(&server, "alice", &[]);
    let r = http()
        .get(format!("{}/ui/api/events", base(&server)))
        .header(AUTHORIZATION, format!("Bearer {ops}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut events = common::SseReader::new(r);
    let mut alice = session(&server, &alice_token).await;
    let id = alice.call_task("sleep", json!({ "seconds": 1.2 })).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains(&"status:completed".to_owned()) {
        assert!(Instant::now() < deadline, "events so far: {seen:?}");
        let e = tokio::time::timeout(Duration::from_secs(20), events.next_event())
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        assert_eq!(e.event.as_deref(), Some("changes"), "{e:?}");
        let batch: Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(batch["dropped"], 0, "{batch}");
        for change in batch["status"].as_array().unwrap() {
            if change["taskId"] == id.as_str() {
                assert_eq!(change["owner"], "principal:alice");
                seen.push(format!("status:{}", change["to"].as_str().unwrap()));
            }
        }
        for report in batch["progress"].as_array().unwrap() {
            if report["taskId"] == id.as_str() {
                assert!(report["progress"].as_f64().unwrap() > 0.0, "{report}");
                seen.push("progress".into());
            }
        }
    }
    assert_eq!(seen.first().map(String::as_str), Some("status:working"));
    assert!(seen.contains(&"progress".to_owned()), "{seen:?}");
}
both_drivers!(events_stream_the_change_feed);

/// Whether the browser test can run here: (node, chromium) or why not.
fn browser() -> Result<PathBuf, String> {
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.exists() {
        return Err(format!(
            "no browser at {} (apt-get install chromium, or set CHROMIUM)",
            chromium.display()
        ));
    }
    if !Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Err("no node on PATH".into());
    }
    Ok(chromium)
}

/// `npm ci` in `tests/console` unless its packages are there.
fn install_packages(dir: &Path) {
    if dir
        .join("node_modules/playwright-core/package.json")
        .exists()
    {
        return;
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .status()
        .expect("npm runs");
    assert!(status.success(), "npm ci in {} failed", dir.display());
}

/// The pages in a real browser: the login page with no error before a
/// try, login refused without an operator token, the overview, the
/// filtered list, the list fitting a 1400 px window with a long owner and
/// message (issue item 5), a refused task told apart from a tool failure
/// (issue item 5), a task's timeline growing live while another client
/// answers its question, the cancel button. Screenshots go to
/// `target/console-screenshots/<driver>/`.
async fn console_in_a_real_browser(driver: Driver) {
    let chromium = match browser() {
        Ok(c) => c,
        Err(why) => {
            if std::env::var_os("TASKBROKER_REQUIRE_BROWSER").is_some() {
                panic!("a browser is required (TASKBROKER_REQUIRE_BROWSER) but {why}");
            }
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping the browser test: {why}");
            return;
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("tests/console");
    install_packages(&dir);

    // With the reference MCP server as an upstream where it is installed
    // (one tool of it), so the overview shows an upstream server.
    let upstream = common::server_everything().map(|script| {
        common::everything_section(&script, "everything", None, "include = [\"get-sum\"]\n")
    });
    let server = match &upstream {
        Some(config) => Server::start_with_config_on(driver, config, &[]),
        None => Server::start_on(driver, &[]),
    };
    let _worker = WorkerProc::start(&server, 1, &[]);
    let ops = create_token(&server, "ops", &["--operator"]);
    let alice_token = create_token(&server, "alice", &[]);
    let long_owner_token = create_token(
        &server,
        "batch-importer-service-account-of-the-operations-team",
        &[],
    );
    let mut alice = session(&server, &alice_token).await;
    for _ in 0..3 {
        let id = alice.call_task("sleep", json!({ "seconds": 0.1 })).await["taskId"]
            .as_str()
            .unwrap()
            .to_owned();
        alice.wait_terminal(&id, Duration::from_secs(30)).await;
    }
    let failed = alice.call_task("fail", json!({})).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    alice.wait_terminal(&failed, Duration::from_secs(30)).await;

    let driver_name = if driver == Driver::Sqlite {
        "sqlite"
    } else {
        "postgres"
    };
    let shots = root.join("target/console-screenshots").join(driver_name);
    let _ = std::fs::remove_dir_all(&shots);
    let has_upstream = upstream.is_some();
    let out = tokio::task::spawn_blocking({
        let (base, ops, shots, failed) =
            (base(&server), ops.clone(), shots.clone(), failed.clone());
        move || {
            Command::new("node")
                .arg("browser.mjs")
                .current_dir(&dir)
                .env("TB_URL", base)
                .env("TB_OPERATOR_TOKEN", ops)
                .env("TB_USER_TOKEN", alice_token)
                .env("TB_SHOTS", shots)
                .env("TB_SEEDED_TOOL", "sleep")
                .env("TB_FAILED_TASK", failed)
                .env("TB_LONG_OWNER_TOKEN", long_owner_token)
                .env("TB_UPSTREAM", if has_upstream { "everything" } else { "" })
                .env("CHROMIUM", chromium)
                .output()
                .expect("node runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log()
    );
    assert!(!stdout.contains("not ok"), "{stdout}");
    if has_upstream {
        assert!(
            stdout.contains("ok - the overview shows the upstream server everything ready"),
            "{stdout}"
        );
    }
    for shot in [
        "01-login.png",
        "03-overview.png",
        "04-tasks-failed.png",
        "06-task-completed.png",
        "08-task-cancelled.png",
    ] {
        let len = std::fs::metadata(shots.join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 10_000, "screenshot {shot}: {len} bytes");
    }
}
both_drivers!(console_in_a_real_browser; flavor = "multi_thread", worker_threads = 2);
