//! Helpers of the `specfit serve` end-to-end tests: a server started on a free loopback port
//! and stopped when dropped, the shipped model's calibration, `specfit generate`'s output to
//! compare with, and small HTTP clients.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use serde_json::Value;

use super::common::*;

pub const POLICIES: [&str; 6] = [
    "ar",
    "eagle3",
    "specfit",
    "specfit-lambda",
    "specfit-resident",
    "specfit-adaptive",
];
pub const QUESTION: &str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?";

/// A `specfit serve` process on a free loopback port.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut child = Command::new(env!("CARGO_BIN_EXE_specfit"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn specfit serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let base = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("specfit serve {args:?} did not start:\n{seen}");
            };
            seen.push_str(&line);
            seen.push('\n');
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        let log = Arc::new(Mutex::new(seen));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Server { child, base, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn client(&self) -> async_openai::Client<OpenAIConfig> {
        async_openai::Client::with_config(
            OpenAIConfig::new()
                .with_api_base(self.url("/v1"))
                .with_api_key("unused"),
        )
    }

    /// SIGTERM, then the exit status (within `within`).
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < within,
                "specfit serve did not exit within {within:?} of SIGTERM:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A calibration for the specfit policies, fitted once from probe forwards on the shipped models.
pub fn calibration() -> &'static str {
    static CAL: OnceLock<String> = OnceLock::new();
    CAL.get_or_init(|| {
        let probes = temp("serve-probes.jsonl");
        let cal = temp("serve-calibration.json");
        ok(&cli(
            "probe --drafter models/drafter --prompt-ids \
                1,243,56,119,188,74,255,15 --cycles 48 --slots 16 --out {}",
            &[probes.to_str().unwrap()],
        ));
        fit_probes(&probes, Some("models/target"), &cal);
        cal.to_str().unwrap().to_string()
    })
}

/// `specfit generate`'s stdout (without its final newline).
pub fn generate(args: &[&str]) -> String {
    let out = ok(&[&["generate"][..], args].concat());
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

/// A JSON array of token ids as `specfit generate` prints them (comma-separated).
pub fn ids(v: &Value) -> String {
    let ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    ids.join(",")
}

/// `body` POSTed to `url` as JSON; the response, unread.
pub async fn send_json(url: &str, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url} {body}: {e}"))
}

/// A raw JSON request; the status and the parsed body.
pub async fn post(url: &str, body: &str) -> (u16, Value) {
    let r = send_json(url, body).await;
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{status}: not JSON: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

pub async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A sample of a Prometheus exposition.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not in\n{text}"))
}

pub fn chat_request(
    max_tokens: u32,
    stream: bool,
) -> async_openai::types::chat::CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("target")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content(QUESTION)
            .build()
            .unwrap()
            .into()])
        .max_completion_tokens(max_tokens)
        .temperature(0.0)
        .stream(stream)
        .build()
        .unwrap()
}
