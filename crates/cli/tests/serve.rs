//! `specfit serve` end to end, over loopback: a standard OpenAI client (async-openai) streams and
//! non-streams chat and text completions and gets, for every policy, exactly what `specfit
//! generate` prints; bad requests get OpenAI-style 4xx errors; thousands of random bodies never
//! get a 5xx; a client that disconnects frees the engine; 32 concurrent streaming clients finish
//! or are refused; SIGTERM drains and exits 0.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs, FinishReason,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use futures_util::StreamExt;
use serde_json::{json, Value};

const POLICIES: [&str; 6] = [
    "ar",
    "eagle3",
    "specfit",
    "specfit-lambda",
    "specfit-resident",
    "specfit-adaptive",
];
const QUESTION: &str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?";

/// A `specfit serve` process on a free loopback port.
struct Server {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
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

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn client(&self) -> async_openai::Client<OpenAIConfig> {
        async_openai::Client::with_config(
            OpenAIConfig::new()
                .with_api_base(self.url("/v1"))
                .with_api_key("unused"),
        )
    }

    /// SIGTERM, then the exit status (within `within`).
    fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
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
fn calibration() -> &'static str {
    static CAL: OnceLock<String> = OnceLock::new();
    CAL.get_or_init(|| {
        let probes = temp("serve-probes.jsonl");
        let cal = temp("serve-calibration.json");
        ok(&[
            "probe",
            "--drafter",
            "models/drafter",
            "--prompt-ids",
            "1,243,56,119,188,74,255,15",
            "--cycles",
            "48",
            "--slots",
            "16",
            "--out",
            probes.to_str().unwrap(),
        ]);
        ok(&[
            "calibrate",
            "--probes",
            probes.to_str().unwrap(),
            "--model",
            "models/target",
            "--out",
            cal.to_str().unwrap(),
        ]);
        cal.to_str().unwrap().to_string()
    })
}

/// `specfit generate`'s stdout (without its final newline).
fn generate(args: &[&str]) -> String {
    let out = ok(&[&["generate"][..], args].concat());
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

/// A JSON array of token ids as `specfit generate` prints them (comma-separated).
fn ids(v: &Value) -> String {
    let ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    ids.join(",")
}

/// A raw JSON request; the status and the parsed body.
async fn post(url: &str, body: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url} {body}: {e}"));
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{status}: not JSON: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A sample of a Prometheus exposition.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not in\n{text}"))
}

fn chat_request(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_policy_gives_a_standard_client_what_specfit_generate_prints() {
    let cal = calibration();
    for policy in POLICIES {
        let server = Server::start(&["--policy", policy, "--calibration", cal]);
        let client = server.client();
        let gen_args = |extra: &[&str]| -> Vec<String> {
            let mut a: Vec<String> = ["--max-tokens", "24", "--store", "disk", "--slots", "16"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            if policy != "ar" {
                a.extend(["--drafter", "--policy", policy, "--calibration", cal].map(String::from));
                a.extend([
                    "--routes".into(),
                    format!("predictor:{}", "models/route-predictor.safetensors"),
                ]);
            }
            a.extend(extra.iter().map(|s| s.to_string()));
            a
        };
        let run = |extra: &[&str]| {
            let a = gen_args(extra);
            generate(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        // Chat, whole and streamed, against `generate --chat`.
        let whole = client.chat().create(chat_request(24, false)).await.unwrap();
        let text = whole.choices[0].message.content.clone().unwrap();
        assert_eq!(
            text,
            run(&["--prompt", QUESTION, "--chat"]),
            "{policy}: chat"
        );
        let usage = whole.usage.unwrap();
        assert!(usage.completion_tokens >= 1 && usage.completion_tokens <= 24);
        if usage.completion_tokens == 24 {
            assert_eq!(whole.choices[0].finish_reason, Some(FinishReason::Length));
        }
        let mut stream = client
            .chat()
            .create_stream(chat_request(24, true))
            .await
            .unwrap();
        let mut streamed = String::new();
        let mut finish = None;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            for c in chunk.choices {
                streamed.push_str(c.delta.content.as_deref().unwrap_or(""));
                finish = finish.or(c.finish_reason);
            }
        }
        assert_eq!(streamed, text, "{policy}: streamed chat");
        assert_eq!(finish, whole.choices[0].finish_reason);
        // Text completions, whole and streamed, against `generate` on the raw prompt.
        let request = CreateCompletionRequestArgs::default()
            .model("target")
            .prompt("The capital of France is")
            .max_tokens(24_u32)
            .temperature(0.0)
            .build()
            .unwrap();
        let whole = client.completions().create(request.clone()).await.unwrap();
        assert_eq!(
            whole.choices[0].text,
            run(&["--prompt", "The capital of France is"]),
            "{policy}: completion"
        );
        let mut stream = client.completions().create_stream(request).await.unwrap();
        let mut streamed = String::new();
        while let Some(chunk) = stream.next().await {
            streamed.push_str(&chunk.unwrap().choices[0].text);
        }
        assert_eq!(
            streamed, whole.choices[0].text,
            "{policy}: streamed completion"
        );
        // Token for token, greedy and sampled (vLLM's return_token_ids extension).
        for (temperature, extra) in [
            (0.0, vec![]),
            (
                0.8,
                vec!["--temperature", "0.8", "--top-p", "0.9", "--seed", "7"],
            ),
        ] {
            let body = json!({"model": "target", "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 24, "temperature": temperature, "top_p": 0.9, "seed": 7, "return_token_ids": true});
            let (status, v) = post(&server.url("/v1/chat/completions"), &body.to_string()).await;
            assert_eq!(status, 200, "{v}");
            let prompt = ids(&v["choices"][0]["prompt_token_ids"]);
            let mut a = vec!["--prompt-ids", prompt.as_str()];
            if temperature == 0.0 {
                a.extend(["--top-p", "0.9"]);
            }
            a.extend(extra.iter());
            assert_eq!(
                ids(&v["choices"][0]["token_ids"]),
                run(&a),
                "{policy}: tokens at temperature {temperature}"
            );
            assert_eq!(v["specfit"]["policy"], policy);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics_describe_the_server() {
    let server = Server::start(&["--policy", "eagle3", "--served-model-name", "tiny-moe"]);
    let client = server.client();
    let models = client.models().list().await.unwrap();
    assert_eq!(models.data.len(), 1);
    assert_eq!(models.data[0].id, "tiny-moe");
    assert_eq!(
        get(&server.url("/health")).await,
        (200, r#"{"status":"ok"}"#.into())
    );
    let (status, v) = post(
        &server.url("/v1/completions"),
        r#"{"model":"tiny-moe","prompt":"Once upon a time","max_tokens":16,"temperature":0}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (_, text) = get(&server.url("/metrics")).await;
    assert_eq!(
        metric(
            &text,
            "specfit_requests_total{endpoint=\"completions\",outcome=\"ok\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(&text, "specfit_completion_tokens_total"),
        v["usage"]["completion_tokens"].as_f64().unwrap()
    );
    assert!(metric(&text, "specfit_tokens_per_cycle") >= 1.0);
    assert!(metric(&text, "specfit_nodes_verified_per_cycle") > 0.0);
    assert!(metric(&text, "specfit_expert_copies_per_token") >= 0.0);
    assert_eq!(metric(&text, "specfit_queue_length"), 0.0);
    // An unknown model is a 404 a standard client reports as an API error.
    let err = client
        .completions()
        .create(
            CreateCompletionRequestArgs::default()
                .model("gpt-4o")
                .prompt("x")
                .build()
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

/// Sends `head` and part of a body, then stalls; returns the status line the server answers.
fn stalled_body(base: &str) -> (String, Duration) {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let start = Instant::now();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\":").unwrap();
    let mut answer = vec![0u8; 4096];
    let n = s.read(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    (text, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let server = Server::start(&[
        "--policy",
        "ar",
        "--max-body-bytes",
        "65536",
        "--read-timeout",
        "1",
    ]);
    let chat = server.url("/v1/chat/completions");
    let completions = server.url("/v1/completions");
    let nowhere = server.url("/v1/nothing");
    let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
    let long_prompt = format!(
        "{{\"prompt\":[{}],\"max_tokens\":4}}",
        vec!["5"; 5000].join(",")
    );
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (&chat, "{not json".into(), 400, "not valid JSON"),
        (&chat, "[]".into(), 400, "JSON object"),
        (
            &chat,
            r#"{"messages":"hi"}"#.into(),
            400,
            "must be an array",
        ),
        (
            &chat,
            format!(r#"{{{msgs},"max_tokens":"10"}}"#),
            400,
            "integer",
        ),
        (
            &chat,
            format!(r#"{{{msgs},"model":"no-such-model"}}"#),
            404,
            "does not exist",
        ),
        (&chat, r#"{"messages":[]}"#.into(), 400, "must not be empty"),
        (
            &chat,
            r#"{"messages":[{"role":"king","content":"x"}]}"#.into(),
            400,
            "unknown role",
        ),
        (
            &chat,
            format!(r#"{{{msgs},"max_tokens":0}}"#),
            400,
            "at least 1",
        ),
        (
            &chat,
            format!(r#"{{{msgs},"max_tokens":-3}}"#),
            400,
            "at least 1",
        ),
        (
            &chat,
            format!(r#"{{{msgs},"max_tokens":100000}}"#),
            400,
            "exceeds this model's context",
        ),
        (
            &chat,
            format!(r#"{{{msgs},"temperature":-1}}"#),
            400,
            "between 0 and 2",
        ),
        (&chat, format!(r#"{{{msgs},"top_p":0}}"#), 400, "(0, 1]"),
        (&chat, format!(r#"{{{msgs},"top_p":1.5}}"#), 400, "(0, 1]"),
        (&completions, long_prompt, 400, "context"),
        (
            &completions,
            r#"{"prompt":[1,999999]}"#.into(),
            400,
            "outside the vocabulary",
        ),
        (
            &completions,
            format!(r#"{{"prompt":"{}"}}"#, "x".repeat(70_000)),
            413,
            "larger than",
        ),
        (&nowhere, "{}".into(), 404, "no route"),
    ];
    for (url, body, status, says) in cases {
        let (got, v) = post(url, &body).await;
        let shown = &body[..body.len().min(80)];
        assert_eq!(got, status, "{shown}: {v}");
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{shown}: {v}"));
        assert!(
            message.contains(says),
            "{shown}: {message:?} should say {says:?}"
        );
        assert!(v["error"]["type"].is_string(), "{v}");
    }
    let (status, v) = post(
        &server.url("/v1/chat/completions"),
        &format!(r#"{{{msgs},"max_tokens":100000}}"#),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    assert_eq!(get(&server.url("/v1/chat/completions")).await.0, 405);
    // A client that never finishes its body is answered 408 once the body timeout passes.
    let (answer, took) = stalled_body(&server.base);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // A client that never finishes its headers has its connection closed.
    let mut s = std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let start = Instant::now();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest); // returns when the server closes the connection
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // Still serving.
    let (status, v) = post(
        &chat,
        &format!(r#"{{{msgs},"max_tokens":4,"temperature":0}}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(get(&server.url("/health")).await.0, 200);
}

/// A small xorshift generator for the fuzz bodies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random JSON value of small depth.
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 2 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(rng.next() as i64 >> rng.below(64)),
        3 => json!((rng.next() as f64 / u64::MAX as f64 - 0.3) * 3.0),
        4 => json!(["", "user", "system", "x", "\u{0}", "é✓", "<|im_start|>"][rng.below(7)]),
        5 => json!(-(rng.below(5) as i64)),
        6 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = ["role", "content", "type", "text", "include_usage", "a"];
            Value::Object(
                (0..rng.below(4))
                    .map(|_| {
                        (
                            keys[rng.below(keys.len())].to_string(),
                            random_value(rng, depth + 1),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// A fuzz body: random bytes, a valid request with one field replaced by a random value, or a
/// valid request with bytes flipped, cut or duplicated.
fn fuzz_body(rng: &mut Rng, chat: bool) -> Vec<u8> {
    let valid = if chat {
        json!({"model": "target", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n"], "stream": false})
    } else {
        json!({"model": "target", "prompt": "Say hi", "max_tokens": 8, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})
    };
    match rng.below(3) {
        0 => (0..rng.below(200)).map(|_| rng.next() as u8).collect(),
        1 => {
            let mut v = valid;
            let fields = [
                "model",
                "messages",
                "prompt",
                "max_tokens",
                "max_completion_tokens",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "stream",
                "stream_options",
                "n",
                "logprobs",
                "chat_template_kwargs",
                "return_token_ids",
            ];
            for _ in 0..=rng.below(2) {
                v[fields[rng.below(fields.len())]] = random_value(rng, 0);
            }
            if rng.below(4) > 0 {
                v["max_tokens"] = json!(1 + rng.below(8)); // keep accepted decodes short
            }
            v.to_string().into_bytes()
        }
        _ => {
            let mut b = valid.to_string().into_bytes();
            for _ in 0..=rng.below(4) {
                let i = rng.below(b.len());
                match rng.below(3) {
                    0 => b[i] = rng.next() as u8,
                    1 => b.truncate(i.max(1)),
                    _ => {
                        let tail = b[i..].to_vec();
                        b.extend_from_slice(&tail);
                    }
                }
            }
            b
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_random_and_mutated_bodies_never_get_a_5xx() {
    let server = Server::start(&[
        "--policy",
        "eagle3",
        "--max-model-len",
        "96",
        "--queue",
        "4",
    ]);
    let client = reqwest::Client::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut rng = Rng(0x5eed_cafe_f00d);
    let bodies: Vec<(bool, Vec<u8>)> = (0..2400)
        .map(|i| (i % 2 == 0, fuzz_body(&mut rng, i % 2 == 0)))
        .collect();
    for batch in bodies.chunks(8) {
        let replies = futures_util::future::join_all(batch.iter().map(|(chat, body)| {
            let url = server.url(if *chat {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            });
            let client = client.clone();
            let body = body.clone();
            async move {
                let r = client
                    .post(url)
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap_or_else(|e| {
                        panic!("no answer to {}: {e}", String::from_utf8_lossy(&body))
                    });
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                assert!(
                    status < 500,
                    "{status} for {}: {text}",
                    String::from_utf8_lossy(&body)
                );
                if status >= 400 {
                    let v: Value =
                        serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: {text}"));
                    assert!(v["error"]["message"].is_string(), "{text}");
                }
                status
            }
        }))
        .await;
        for s in replies {
            *statuses.entry(s).or_default() += 1;
        }
    }
    eprintln!("fuzz statuses: {statuses:?}");
    assert!(
        statuses.get(&200).copied().unwrap_or(0) > 50,
        "{statuses:?}"
    );
    assert!(
        statuses.get(&400).copied().unwrap_or(0) > 500,
        "{statuses:?}"
    );
    assert_eq!(get(&server.url("/health")).await.0, 200);
    let (_, text) = get(&server.url("/metrics")).await;
    assert_eq!(
        metric(
            &text,
            "specfit_requests_total{endpoint=\"chat\",outcome=\"failed\"}"
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_streamed_or_not_frees_the_engine_for_the_next_request() {
    let server = Server::start(&["--policy", "specfit", "--calibration", calibration()]);
    let body = json!({"model": "target", "prompt": "Once upon a time", "max_tokens": 3000,
        "temperature": 0.9, "seed": 1, "stream": true, "ignore_eos": true});
    let r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let mut chunks = r.bytes_stream();
    for _ in 0..3 {
        chunks.next().await.unwrap().unwrap();
    }
    drop(chunks); // the client goes away mid-stream
    let start = Instant::now();
    let (status, v) = post(
        &server.url("/v1/completions"),
        r#"{"prompt":"Hello","max_tokens":4,"temperature":0}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    // The rest of the 3,000 tokens would take several seconds here; the next request waited
    // for a cycle or two (bounds generous for a loaded CI machine).
    let waited = v["specfit"]["time_to_first_token_ms"].as_f64().unwrap();
    assert!(waited < 2000.0, "the next request waited {waited} ms");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    let (_, text) = get(&server.url("/metrics")).await;
    assert_eq!(
        metric(
            &text,
            "specfit_requests_total{endpoint=\"completions\",outcome=\"cancelled\"}"
        ),
        1.0
    );
    assert!(metric(&text, "specfit_completion_tokens_total") < 1000.0);
    // A client waiting for a whole (non-streamed) answer that hangs up cancels it too.
    let gone = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .timeout(Duration::from_millis(300))
        .body(
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3000,
            "ignore_eos": true, "temperature": 0.9})
            .to_string(),
        )
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up first");
    let (status, v) = post(
        &server.url("/v1/completions"),
        r#"{"prompt":"Hello","max_tokens":4}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let waited = v["specfit"]["time_to_first_token_ms"].as_f64().unwrap();
    assert!(waited < 2000.0, "the next request waited {waited} ms");
    let (_, text) = get(&server.url("/metrics")).await;
    assert_eq!(
        metric(
            &text,
            "specfit_requests_total{endpoint=\"chat\",outcome=\"cancelled\"}"
        ),
        1.0
    );
    assert!(metric(&text, "specfit_completion_tokens_total") < 2000.0);
}

/// One streaming client: its text, time to first chunk and total time; or the refusal status.
async fn stream_once(url: String, body: Value) -> Result<(String, Duration, Duration), u16> {
    let start = Instant::now();
    let r = reqwest::Client::new()
        .post(url)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    if status != 200 {
        assert!(status == 429 || status == 503, "{status}");
        assert!(r.headers().get("retry-after").is_some());
        return Err(status);
    }
    let mut text = String::new();
    let mut first = None;
    let mut buf = String::new();
    let mut chunks = r.bytes_stream();
    let mut done = false;
    while let Some(c) = chunks.next().await {
        buf.push_str(&String::from_utf8_lossy(&c.unwrap()));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap().to_string();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            first.get_or_insert(start.elapsed());
            let v: Value = serde_json::from_str(&data).unwrap();
            if let Some(c) = v["choices"].get(0) {
                text.push_str(c["text"].as_str().unwrap_or_default());
            }
        }
    }
    assert!(done, "the stream ended without [DONE]");
    Ok((text, first.unwrap(), start.elapsed()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_streaming_clients_finish_or_are_refused_and_match_their_sequential_runs(
) {
    let server = Server::start(&[
        "--policy",
        "specfit",
        "--calibration",
        calibration(),
        "--queue",
        "16",
    ]);
    let prompts = [
        "Once upon a time",
        "The capital of France is",
        QUESTION,
        "def fib(n):",
        "Summarize: the cat sat on the mat.",
    ];
    let request = |i: usize| {
        json!({"model": "target", "prompt": prompts[i % prompts.len()], "max_tokens": 8 + (i * 7) % 57,
            "temperature": if i.is_multiple_of(3) { 0.7 } else { 0.0 }, "seed": i, "stream": true})
    };
    let url = server.url("/v1/completions");
    let mut sequential = Vec::new();
    for i in 0..32 {
        sequential.push(stream_once(url.clone(), request(i)).await.unwrap().0);
    }
    let idle = metric(
        &get(&server.url("/metrics")).await.1,
        "process_resident_memory_bytes",
    );
    let start = Instant::now();
    let clients: Vec<_> = (0..32)
        .map(|i| {
            tokio::spawn(tokio::time::timeout(
                Duration::from_secs(120),
                stream_once(url.clone(), request(i)),
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    let mut first_chunks = Vec::new();
    let mut refused = 0;
    for (i, c) in clients.into_iter().enumerate() {
        match c.await.unwrap().expect("a client hung") {
            Ok((text, first, total)) => {
                assert_eq!(text, sequential[i], "client {i}");
                latencies.push(total);
                first_chunks.push(first);
            }
            Err(_) => refused += 1,
        }
    }
    let wall = start.elapsed();
    // 16 places in the queue: at least 16 are taken, whatever the arrival order.
    assert!(
        latencies.len() >= 16,
        "{} completed, {refused} refused",
        latencies.len()
    );
    let (_, text) = get(&server.url("/metrics")).await;
    assert_eq!(metric(&text, "specfit_queue_length"), 0.0);
    assert_eq!(metric(&text, "specfit_requests_in_flight"), 0.0);
    let after = metric(&text, "process_resident_memory_bytes");
    assert!(
        after <= idle * 1.10 + 16.0 * 1048576.0,
        "memory {idle} at idle, {after} after the load"
    );
    latencies.sort();
    first_chunks.sort();
    let pct =
        |v: &[Duration], p: f64| v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    eprintln!(
        "load: 32 concurrent streaming clients, {} completed, {refused} refused, {:.1} s wall, {:.1} completed requests/s; latency p50 {:.0} ms p99 {:.0} ms; first chunk p50 {:.0} ms p99 {:.0} ms; RSS {:.1} MiB idle, {:.1} MiB after",
        latencies.len(),
        wall.as_secs_f64(),
        latencies.len() as f64 / wall.as_secs_f64(),
        pct(&latencies, 0.5),
        pct(&latencies, 0.99),
        pct(&first_chunks, 0.5),
        pct(&first_chunks, 0.99),
        idle / 1048576.0,
        after / 1048576.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_progress_refuses_new_ones_and_exits_zero() {
    let mut server = Server::start(&["--policy", "eagle3", "--shutdown-grace", "20"]);
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true});
    let url = server.url("/v1/completions");
    let running = tokio::spawn(stream_once(url.clone(), body));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = server.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // New requests are refused (503) or find the listener closed.
    if let Ok(r) = reqwest::Client::new()
        .post(&url)
        .body(r#"{"prompt":"x","max_tokens":2}"#)
        .send()
        .await
    {
        assert_eq!(r.status().as_u16(), 503);
    }
    let (text, _, _) = running
        .await
        .unwrap()
        .expect("the request in progress finishes");
    assert!(!text.is_empty());
    let status = server.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    // With no grace left, a long decode is cancelled and the server still exits 0 promptly.
    let mut server = Server::start(&["--policy", "ar", "--shutdown-grace", "0.2"]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0.9, "stream": true, "ignore_eos": true});
    let running = tokio::spawn(stream_once(server.url("/v1/completions"), body));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let status = server.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let _ = running.await;
    let said = || {
        server
            .log
            .lock()
            .unwrap()
            .contains("cancelling the requests still running")
    };
    let start = Instant::now();
    while !said() && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(said(), "{}", server.log.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_turn_reuses_the_earlier_prefill_and_decodes_the_same_tokens() {
    let cal = calibration();
    let server = Server::start(&["--calibration", cal]);
    let url = server.url("/v1/chat/completions");
    let turn = |messages: Value| {
        json!({"messages": messages, "max_tokens": 24, "temperature": 0, "return_token_ids": true})
            .to_string()
    };
    let first = json!([{"role": "system", "content": "You are a careful tutor."},
        {"role": "user", "content": QUESTION}]);
    let (status, one) = post(&url, &turn(first.clone())).await;
    assert_eq!(status, 200, "{one}");
    let answer = one["choices"][0]["message"]["content"].as_str().unwrap();
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": answer}));
    second.push(json!({"role": "user", "content": "Now explain it step by step."}));
    let (status, two) = post(&url, &turn(Value::Array(second))).await;
    assert_eq!(status, 200, "{two}");
    // The second prompt starts with the whole first prompt: all of it but its last position
    // comes from the cache (the drafter reruns one more).
    let first_len = one["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= first_len - 2 && cached < two["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{cached} of {first_len}"
    );
    let (_, metrics) = get(&server.url("/metrics")).await;
    assert_eq!(
        metric(&metrics, "specfit_prompt_tokens_cached_total"),
        cached as f64
    );
    // And the tokens are what `specfit generate` gives on the whole prompt.
    let prompt = ids(&two["choices"][0]["prompt_token_ids"]);
    let want = generate(&[
        "--prompt-ids",
        &prompt,
        "--max-tokens",
        "24",
        "--store",
        "disk",
        "--slots",
        "16",
        "--drafter",
        "--policy",
        "specfit",
        "--calibration",
        cal,
        "--routes",
        "predictor:models/route-predictor.safetensors",
    ]);
    assert_eq!(ids(&two["choices"][0]["token_ids"]), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_file_is_served_with_its_own_tokenizer_and_chat_template() {
    let gguf = "fixtures/gguf/tiny-q4_k_m.gguf";
    let server = Server::start(&["--model", gguf, "--policy", "ar", "--slots", "2"]);
    let client = server.client();
    let models = client.models().list().await.unwrap();
    assert_eq!(models.data[0].id, "tiny-q4_k_m");
    let request = CreateChatCompletionRequestArgs::default()
        .model("tiny-q4_k_m")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("What is 12 times 7?")
            .build()
            .unwrap()
            .into()])
        .max_completion_tokens(16_u32)
        .temperature(0.0)
        .build()
        .unwrap();
    let reply = client.chat().create(request).await.unwrap();
    let want = generate(&[
        "--model",
        gguf,
        "--prompt",
        "What is 12 times 7?",
        "--chat",
        "--store",
        "disk",
        "--slots",
        "2",
        "--max-tokens",
        "16",
    ]);
    assert!(!want.is_empty());
    assert_eq!(reply.choices[0].message.content.clone().unwrap(), want);
    assert!(reply.usage.unwrap().prompt_tokens > 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_and_allowed_origins_guard_the_api() {
    let server = Server::start(&[
        "--policy",
        "ar",
        "--api-key",
        "sesame",
        "--allowed-origin",
        "http://chat.example",
    ]);
    // A standard client with the key works; without it or with another key: 401.
    let keyed = async_openai::Client::with_config(
        OpenAIConfig::new()
            .with_api_base(server.url("/v1"))
            .with_api_key("sesame"),
    );
    assert_eq!(keyed.models().list().await.unwrap().data[0].id, "target");
    let err = server.client().models().list().await.unwrap_err();
    assert!(err.to_string().contains("API key"), "{err}");
    let (status, v) = post(
        &server.url("/v1/completions"),
        r#"{"prompt":"x","max_tokens":2}"#,
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    for (model, status) in [("target", 200), ("gpt-4o", 404)] {
        let r = reqwest::Client::new()
            .get(server.url(&format!("/v1/models/{model}")))
            .bearer_auth("sesame")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{model}");
    }
    // Health and metrics stay open.
    assert_eq!(get(&server.url("/health")).await.0, 200);
    assert_eq!(get(&server.url("/metrics")).await.0, 200);
    // CORS: the allowed origin's preflight is answered, another origin's is not.
    let preflight = |origin: &'static str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization, content-type",
            )
            .send()
    };
    let ok = preflight("http://chat.example").await.unwrap();
    assert_eq!(
        ok.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap()),
        Some("http://chat.example")
    );
    let other = preflight("http://elsewhere.example").await.unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
}
