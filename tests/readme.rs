//! README.md is true to the program (issue 12, point 7): every flag of
//! every subcommand's `--help` is in README's "Commands" section, every
//! `TASKBROKER_*` variable README names exists (and every one the program
//! reads is named), the environment rule README states holds, and the
//! quickstart and the curl example run as written. README.md is read at
//! test time, so a README change that breaks them fails here.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_taskbroker");

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// The text of README's section `## <title>`, up to the next `## `.
#[track_caller]
fn section(readme: &str, title: &str) -> String {
    let start = readme
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("README has no section '{title}'"));
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_owned()
}

/// The fenced block after the marker `<!-- tested by tests/readme.rs: NAME -->`.
#[track_caller]
fn tested_block(readme: &str, name: &str) -> String {
    let marker = format!("<!-- tested by tests/readme.rs: {name} -->");
    let at = readme
        .find(&marker)
        .unwrap_or_else(|| panic!("README has no marker {marker}"));
    let rest = &readme[at + marker.len()..];
    let open = rest.find("```").unwrap();
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("```").unwrap()].to_owned()
}

/// `taskbroker ARGS --help`.
#[track_caller]
fn help(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommand names a help text lists under "Commands:" (not `help`).
fn subcommands(help: &str) -> Vec<String> {
    let Some(start) = help.find("\nCommands:\n") else {
        return Vec::new();
    };
    help[start + 11..]
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path (`serve`, `tasks list`, `token create`, ...) with
/// its help text, found from `taskbroker --help` down.
fn every_command() -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut todo: Vec<Vec<String>> = subcommands(&help(&[]))
        .into_iter()
        .map(|c| vec![c])
        .collect();
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let nested = subcommands(&text);
        if nested.is_empty() {
            found.insert(path.join(" "), text);
        } else {
            for sub in nested {
                let mut deeper = path.clone();
                deeper.push(sub);
                todo.push(deeper);
            }
        }
    }
    found
}

/// Each `--flag` of a help text with its `[env: NAME]`, if any.
fn flags(help: &str) -> BTreeMap<String, Option<String>> {
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let option_line = trimmed.starts_with('-') && line.len() - trimmed.len() <= 6;
        if option_line {
            current = trimmed
                .split([' ', ',', '='])
                .find(|w| w.starts_with("--"))
                .map(str::to_owned);
            if let Some(flag) = &current {
                flags.insert(flag.clone(), None);
            }
        }
        if let (Some(flag), Some(at)) = (&current, line.find("[env: ")) {
            let name: String = line[at + 6..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            flags.insert(flag.clone(), Some(name));
        }
    }
    flags.remove("--help");
    flags.remove("--version");
    flags
}

/// Whether `text` has `flag` as a whole flag (`--rate` is not in
/// `--rate-burst`).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        !text[at + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// Every `TASKBROKER_*` name in a text.
fn variables(text: &str) -> BTreeSet<String> {
    text.match_indices("TASKBROKER_")
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .collect()
}

/// What command tools get in their environment (README "The config file"),
/// not settings of taskbroker itself.
const TOOL_VARIABLES: [&str; 4] = [
    "TASKBROKER_TASK_ID",
    "TASKBROKER_ATTEMPT",
    "TASKBROKER_TOOL",
    "TASKBROKER_EVENTS_FD",
];

/// Issue 12, point 7: every flag of every subcommand (found from `--help`,
/// nested ones too) is in README's Commands section, and every command has
/// a synopsis line there.
#[test]
fn issue12_p7_every_flag_of_every_command_is_in_readme_commands() {
    let readme = readme();
    let commands = section(&readme, "Commands");
    let all = every_command();
    for expected in [
        "serve",
        "worker",
        "tasks list",
        "token create",
        "bench",
        "call",
    ] {
        assert!(all.contains_key(expected), "{expected}: {:?}", all.keys());
    }
    let mut missing = Vec::new();
    for (command, text) in &all {
        // `tasks get|result|cancel` share one synopsis line.
        let synopsis_word = command.split(' ').next_back().unwrap();
        let first = command.split(' ').next().unwrap();
        let has_synopsis = commands.lines().any(|l| {
            l.trim_start().starts_with(&format!("taskbroker {first}"))
                && (l.contains(synopsis_word) || !command.contains(' '))
        });
        if !has_synopsis {
            missing.push(format!("synopsis of `taskbroker {command}`"));
        }
        for flag in flags(text).keys() {
            if !mentions(&commands, flag) {
                missing.push(format!("`taskbroker {command} {flag}`"));
            }
        }
    }
    assert!(missing.is_empty(), "not in README's Commands: {missing:#?}");
}

/// Issue item 5: `taskbroker --help` names both protocol generations the
/// broker serves, as README's introduction does, not only the older one.
#[test]
fn item5_help_names_both_protocol_versions() {
    let text = help(&[]);
    let about = text.lines().next().unwrap();
    for version in ["2025-11-25", "2026-07-28"] {
        assert!(about.contains(version), "{about}");
        assert!(readme().contains(&format!("MCP {version}")), "{version}");
    }
}

/// Issue 12, point 7: every `TASKBROKER_*` variable README names is read by
/// the program (clap prints `[env: ...]`) or given to command tools, and
/// every variable the program reads is in README; README's rule for serve
/// and worker (every flag has `TASKBROKER_<FLAG>`) holds.
#[test]
fn issue12_p7_environment_variables_in_readme_are_true() {
    let readme = readme();
    let all = every_command();
    let mut in_help = BTreeSet::new();
    for text in all.values() {
        in_help.extend(flags(text).into_values().flatten());
    }
    let in_readme = variables(&readme);
    let tool_side: BTreeSet<String> = TOOL_VARIABLES.iter().map(|v| v.to_string()).collect();
    let made_up: Vec<_> = in_readme
        .difference(&in_help)
        .filter(|v| !tool_side.contains(*v) && v.as_str() != "TASKBROKER_")
        .collect();
    assert!(
        made_up.is_empty(),
        "README names unknown variables: {made_up:?}"
    );
    let undocumented: Vec<_> = in_help.difference(&in_readme).collect();
    assert!(
        undocumented.is_empty(),
        "variables missing from README: {undocumented:?}"
    );
    let command_tool = include_str!("../src/tools/command.rs");
    for v in TOOL_VARIABLES {
        assert!(
            command_tool.contains(v),
            "{v} is not given to command tools"
        );
    }

    // "Every flag of serve and worker can also be set by environment:
    // TASKBROKER_ and the flag's name in capitals, except --allowed-origin."
    for command in ["serve", "worker"] {
        for (flag, env) in flags(&all[command]) {
            let want = match flag.as_str() {
                "--allowed-origin" => "TASKBROKER_ALLOWED_ORIGINS".to_owned(),
                _ => format!(
                    "TASKBROKER_{}",
                    flag.trim_start_matches("--")
                        .replace('-', "_")
                        .to_uppercase()
                ),
            };
            assert_eq!(env.as_deref(), Some(want.as_str()), "{command} {flag}");
        }
    }
}

/// Issue 12, point 7: `TASKBROKER_NO_DEMO_TOOLS` and
/// `TASKBROKER_CONFORMANCE_TOOLS` work like their flags, with the boolean
/// words README lists.
#[tokio::test]
async fn issue12_p7_boolean_flags_are_set_by_environment() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .arg("serve")
        .env("TASKBROKER_DB", dir.path().join("env.db"))
        .env("TASKBROKER_LISTEN", "127.0.0.1:0")
        .env("TASKBROKER_NO_DEMO_TOOLS", "yes")
        .env("TASKBROKER_CONFORMANCE_TOOLS", "1")
        .env_remove("TASKBROKER_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _server = Reaper(vec![child]);
    let url = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line.trim()
            .trim_start_matches("taskbroker listening on ")
            .to_owned()
    };
    let mut c = common::Client::new(&url);
    c.initialize().await;
    let tools = c.ok("tools/list", json!({})).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"test_simple_text"), "{names:?}");
    assert!(!names.contains(&"echo"), "{names:?}");

    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("TASKBROKER_DB", dir.path().join("env.db"))
        .env("TASKBROKER_NO_DEMO_TOOLS", "perhaps")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Kills the processes a README command left running.
struct Reaper(Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A folder like a fresh clone's, for running README's commands: a copy of
/// `examples/`, `taskbroker` on PATH, its own state folder and home.
struct Sandbox {
    dir: tempfile::TempDir,
    port: u16,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("taskbroker-readme-")
            .tempdir()
            .unwrap();
        copy_dir(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples")),
            &dir.path().join("examples"),
        );
        for sub in ["bin", "state", "home"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(BIN, dir.path().join("bin/taskbroker")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self { dir, port }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// bash in the sandbox: the working directory is the sandbox, and the
    /// broker's address is a free port (`TASKBROKER_LISTEN`, `TASKBROKER_URL`).
    fn bash(&self) -> Command {
        let path = format!(
            "{}:{}",
            self.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new("bash");
        c.current_dir(self.path())
            .env("PATH", path)
            .env("HOME", self.path().join("home"))
            .env("XDG_STATE_HOME", self.path().join("state"))
            .env("TASKBROKER_LISTEN", format!("127.0.0.1:{}", self.port))
            .env(
                "TASKBROKER_URL",
                format!("http://127.0.0.1:{}/mcp", self.port),
            )
            .env_remove("RUST_LOG")
            .env_remove("TASKBROKER_DB")
            .env_remove("TASKBROKER_CONFIG")
            .env_remove("TASKBROKER_TOKEN")
            .stdin(Stdio::null());
        c
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            // Keeps the mode: the tools stay executable.
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// What a README command printed.
#[derive(Debug)]
struct Ran {
    line: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs README's block `name` line by line as written (`cargo run
/// --release --` read as `taskbroker`) with bash in `sandbox`: a line
/// ending in `&` is started in the background with its output in
/// `<n>.log` (a `serve` is waited for until it listens, as a person
/// would); every other line runs to its end.
fn run_block(sandbox: &Sandbox, name: &str) -> (Reaper, Vec<Ran>) {
    let block = tested_block(&readme(), name);
    let mut background = Reaper(Vec::new());
    let mut ran = Vec::new();
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with('#') {
            continue;
        }
        let line = line.replace("cargo run --release --", "taskbroker");
        let code = line.split(" #").next().unwrap().trim_end();
        if let Some(command) = code.strip_suffix('&') {
            let log_path = sandbox.path().join(format!("{}.log", background.0.len()));
            let log = std::fs::File::create(&log_path).unwrap();
            let child = sandbox
                .bash()
                .arg("-c")
                .arg(format!("exec {command}"))
                .stdout(Stdio::from(log.try_clone().unwrap()))
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap();
            background.0.push(child);
            if command.contains(" serve") {
                wait_for_port(sandbox.port, &log_path);
            }
            continue;
        }
        let out = sandbox.bash().arg("-c").arg(&line).output().unwrap();
        ran.push(Ran {
            line: line.clone(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    (background, ran)
}

/// The run of `taskbroker call TOOL ...` among a block's lines.
#[track_caller]
fn call_of<'a>(ran: &'a [Ran], tool: &str) -> &'a Ran {
    ran.iter()
        .find(|r| r.line.contains(&format!("call {tool} ")))
        .unwrap_or_else(|| panic!("no `call {tool}` in the block: {ran:#?}"))
}

/// `countdown from N finished` on stdout, the task line on stderr, exit 0.
#[track_caller]
fn assert_countdown_finished(countdown: &Ran, seconds: u32) {
    assert_eq!(countdown.code, Some(0), "{countdown:#?}");
    assert!(
        countdown
            .stdout
            .starts_with(&format!("countdown from {seconds} finished (task ")),
        "{countdown:#?}"
    );
    assert!(
        countdown.stderr.contains("taskbroker: task "),
        "{countdown:#?}"
    );
}

/// Issue 12, point 7: README's quickstart, run line by line as written
/// with bash in a fresh folder holding a copy of `examples/`, so
/// `--config` is a relative path: the server starts and makes its database
/// in the working directory, `checksum` answers the SHA-256 of
/// examples/taskbroker.toml, and the `countdown` task runs to its end.
#[test]
fn issue12_p7_quickstart_runs_as_written() {
    let sandbox = Sandbox::new();
    let (background, ran) = run_block(&sandbox, "quickstart");
    assert_eq!(background.0.len(), 1, "one server in the background");
    let log = std::fs::read_to_string(sandbox.path().join("0.log")).unwrap();
    assert!(log.contains("taskbroker listening on"), "{log}");
    assert!(
        sandbox.path().join("taskbroker.db").exists(),
        "the database is made in the working directory"
    );

    let checksum = call_of(&ran, "checksum");
    assert_eq!(checksum.code, Some(0), "{checksum:#?}");
    let answer: Value = serde_json::from_str(checksum.stdout.trim()).unwrap();
    let file = sandbox.path().join("examples/taskbroker.toml");
    let want = Sha256::digest(std::fs::read(&file).unwrap());
    let want: String = want.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(answer["sha256"], json!(want), "{checksum:#?}");
    assert_eq!(
        PathBuf::from(answer["path"].as_str().unwrap()),
        file.canonicalize().unwrap()
    );

    assert_countdown_finished(call_of(&ran, "countdown"), 5);
    assert_eq!(ran.len(), 2, "{ran:#?}");
}

/// Issue item 5: README's "Worker processes" commands, run as written from
/// a folder like the repository's root: every command succeeds (the config
/// file is `examples/taskbroker.toml`), and the countdown task finishes
/// although the server runs no jobs itself, so the worker process ran it;
/// `taskbroker workers` shows that process live.
#[test]
fn item5_worker_processes_run_as_written() {
    let sandbox = Sandbox::new();
    let (background, ran) = run_block(&sandbox, "workers");
    assert_eq!(background.0.len(), 2, "a server and a worker: {ran:#?}");
    for r in &ran {
        assert_eq!(r.code, Some(0), "{r:#?}");
    }
    assert_countdown_finished(call_of(&ran, "countdown"), 2);
    let out = sandbox
        .bash()
        .args(["-c", "taskbroker workers --json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let pools: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<(&str, &str)> = pools
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["state"].as_str().unwrap()))
        .collect();
    assert!(kinds.contains(&("process", "live")), "{pools}");
}

/// Issue 25: README's upstream example, run as written in a fresh folder:
/// the three config lines as `taskbroker.toml`, the broker started on it,
/// two task calls answered by the reference server, and `taskbroker
/// upstreams` showing it ready. `npx -y` would fetch the server from the
/// npm registry; here `npx` runs the copy of the same package that
/// tests/upstream installs (skipped without it, unless
/// TASKBROKER_REQUIRE_UPSTREAMS is set, as CI does).
#[test]
fn issue25_upstream_example_runs_as_written() {
    let server = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/upstream/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
    ));
    if !server.exists() {
        assert!(
            std::env::var_os("TASKBROKER_REQUIRE_UPSTREAMS").is_none(),
            "{} is missing: run npm ci in tests/upstream",
            server.display()
        );
        eprintln!(
            "skipped: no {} (npm ci in tests/upstream)",
            server.display()
        );
        return;
    }
    let sandbox = Sandbox::new();
    let npx = sandbox.path().join("bin/npx");
    std::fs::write(
        &npx,
        format!(
            "#!/bin/sh\n[ \"$*\" = \"-y @modelcontextprotocol/server-everything\" ] || exit 64\nexec node {}\n",
            server.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        sandbox.path().join("taskbroker.toml"),
        tested_block(&readme(), "upstream-config"),
    )
    .unwrap();
    let (background, ran) = run_block(&sandbox, "upstream");
    assert_eq!(background.0.len(), 1, "one server in the background");
    for r in &ran {
        assert_eq!(r.code, Some(0), "{r:#?}");
    }
    let sum = call_of(&ran, "get-sum");
    assert_eq!(sum.stdout.trim(), "The sum of 2 and 3 is 5.", "{sum:#?}");
    assert!(sum.stderr.contains("taskbroker: task "), "a task: {sum:#?}");
    let long = call_of(&ran, "trigger-long-running-operation");
    assert!(
        long.stdout.contains("Duration: 3 seconds, Steps: 3"),
        "{long:#?}"
    );
    let upstreams = ran
        .iter()
        .find(|r| r.line.starts_with("taskbroker upstreams"))
        .unwrap();
    let row = upstreams.stdout.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("everything") && row.contains(" ready "),
        "{upstreams:#?}"
    );
    let log = std::fs::read_to_string(sandbox.path().join("0.log")).unwrap();
    assert!(log.contains("upstream ready"), "{log}");
}

#[track_caller]
fn wait_for_port(port: u16, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every JSON-RPC message in a text of concatenated JSON and SSE, in order.
fn messages(text: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find('{') {
        let start = at + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) if v.get("jsonrpc").is_some() => {
                found.push(v);
                at = start + stream.byte_offset();
            }
            _ => at = start + 1,
        }
    }
    found
}

/// Run README's block `name` as one bash script (`-e -o pipefail`) against
/// `url` instead of the default endpoint, then print `vars` as `NAME=value`
/// lines; returns stdout.
fn run_curl_block(name: &str, url: &str, vars: &[&str]) -> String {
    let sandbox = Sandbox::new();
    let block = tested_block(&readme(), name);
    let default = "http://127.0.0.1:8808/mcp";
    assert!(block.contains(default), "{block}");
    let mut script = block.replace(default, url);
    for var in vars {
        script.push_str(&format!("\nprintf '\\n{var}=%s\\n' \"${var}\""));
    }
    script.push('\n');
    std::fs::write(sandbox.path().join("curl.sh"), script).unwrap();
    let out = sandbox
        .bash()
        .args(["-e", "-o", "pipefail", "curl.sh"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `result` of the JSON-RPC answer with `id` in a script's output;
/// panics when there is none, or it is an error.
fn answer_result(stdout: &str, id: i64) -> Value {
    let by_id: BTreeMap<i64, Value> = messages(stdout)
        .into_iter()
        .filter_map(|m| Some((m.get("id")?.as_i64()?, m)))
        .collect();
    let m = by_id
        .get(&id)
        .unwrap_or_else(|| panic!("no answer {id}: {stdout}"));
    assert!(m.get("error").is_none(), "answer {id} is an error: {m}");
    m["result"].clone()
}

/// The value of a `NAME=value` line of a script's output.
fn script_var(stdout: &str, name: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_default()
        .to_owned()
}

/// Issue 12, point 7: README's curl example, run as one bash script as
/// written (its URL pointed at a test broker): initialize gives a session,
/// the task is created, tasks/get and tasks/list show it, tasks/result
/// returns its result, and the cancel of the second, long task answers
/// `cancelled`. No command fails.
#[tokio::test]
async fn issue12_p7_curl_example_runs_as_written() {
    let server = common::Server::start(&[]);
    let stdout = run_curl_block("curl", &server.url, &["SID", "TASK", "LONG"]);
    let (sid, task, long) = (
        script_var(&stdout, "SID"),
        script_var(&stdout, "TASK"),
        script_var(&stdout, "LONG"),
    );
    assert!(sid.len() >= 16, "a session id: {stdout}");
    uuid::Uuid::parse_str(&task).unwrap_or_else(|e| panic!("TASK {task:?}: {e}: {stdout}"));
    uuid::Uuid::parse_str(&long).unwrap_or_else(|e| panic!("LONG {long:?}: {e}: {stdout}"));

    let result = |id: i64| answer_result(&stdout, id);
    assert_eq!(result(2)["task"]["taskId"], json!(task));
    assert_eq!(result(2)["task"]["status"], "working");
    assert_eq!(result(3)["taskId"], json!(task));
    assert_eq!(result(4)["content"][0]["text"], "done");
    assert_eq!(
        result(4)["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(task)
    );
    let list = result(5);
    let listed: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert!(listed.contains(&task.as_str()), "{listed:?}");
    assert_eq!(result(7)["taskId"], json!(long));
    assert_eq!(result(7)["status"], "cancelled");
}

/// Issue 16: README's 2026-07-28 curl example, run as one bash script as
/// written: server/discover advertises the tasks extension, `sleep` becomes
/// a task (the request declares the extension) and tasks/get shows it
/// completed with its result inline.
#[tokio::test]
async fn issue16_curl_2026_example_runs_as_written() {
    let server = common::Server::start(&[]);
    let stdout = run_curl_block("curl-2026", &server.url, &["TASK"]);
    let task = script_var(&stdout, "TASK");
    uuid::Uuid::parse_str(&task).unwrap_or_else(|e| panic!("TASK {task:?}: {e}: {stdout}"));
    let result = |id: i64| answer_result(&stdout, id);
    assert_eq!(
        result(1)["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({})
    );
    assert_eq!(result(3)["taskId"], json!(task));
    assert_eq!(result(3)["status"], "completed");
    assert_eq!(result(3)["resultType"], "complete");
    assert_eq!(result(3)["result"]["content"][0]["text"], "slept 2 s");
}

/// The byte offset where each column of a header line starts.
fn column_starts(header: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut at = 0;
    for word in header.split_whitespace() {
        let found = header[at..].find(word).unwrap() + at;
        starts.push(found);
        at = found + word.len();
    }
    starts
}

/// Whether every line's cells start where the header's columns start (a
/// line may end early: an empty last cell).
fn aligned(lines: &[&str]) -> bool {
    let starts = column_starts(lines[0]);
    lines[1..].iter().all(|line| {
        let bytes = line.as_bytes();
        starts
            .iter()
            .filter(|&&s| s > 0 && s < bytes.len())
            .all(|&s| bytes[s - 1] == b' ' && bytes[s] != b' ')
    })
}

/// Issue item 5: `taskbroker tasks list` prints the header README shows
/// (the same columns, in the same order), its rows aligned under it as in
/// README's sample; the two tasks a user just made show, newest first.
#[tokio::test]
async fn item5_tasks_list_prints_the_header_readme_shows() {
    let block = tested_block(&readme(), "tasks-list");
    let sample: Vec<&str> = block
        .lines()
        .skip_while(|l| !l.starts_with("$ taskbroker tasks list"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(sample.len() >= 2, "{block}");
    assert!(aligned(&sample), "README's sample is aligned: {block}");

    let server = common::Server::start(&[]);
    let sandbox = Sandbox::new();
    let run = |line: &str| {
        let out = sandbox
            .bash()
            .arg("-c")
            .arg(format!("{line} --url {}", server.url))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(
        run(r#"taskbroker call sleep --args '{"seconds":0}' --task"#).0,
        Some(0)
    );
    assert_eq!(run("taskbroker call fail --task").0, Some(1));
    let (code, stdout) = run("taskbroker tasks list");
    assert_eq!(code, Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two tasks: {stdout}");
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(words(lines[0]), words(sample[0]), "{stdout}");
    assert!(aligned(&lines), "{stdout}");
    assert_eq!(words(lines[1])[1..3], ["failed", "fail"], "{stdout}");
    assert_eq!(words(lines[2])[1..3], ["completed", "sleep"], "{stdout}");
}
