//! `specfit serve` end to end, over loopback: a standard OpenAI client (async-openai) streams and
//! non-streams chat and text completions and gets, for every policy, exactly what `specfit
//! generate` prints; a client that disconnects frees the engine; 32 concurrent streaming clients
//! finish or are refused; SIGTERM drains and exits 0; prompts are cached; GGUF files, API keys
//! and origins. Bad and random request bodies are `serve_input.rs`'s.

mod common;
mod serve_common;
use common::cli;
use serve_common::*;

use std::process::Command;
use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs, FinishReason,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use futures_util::StreamExt;
use serde_json::{json, Value};

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
            generate(&common::words(&a))
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_streamed_or_not_frees_the_engine_for_the_next_request() {
    let server = Server::start(&["--policy", "specfit", "--calibration", calibration()]);
    let body = json!({"model": "target", "prompt": "Once upon a time", "max_tokens": 3000,
        "temperature": 0.9, "seed": 1, "stream": true, "ignore_eos": true});
    let r = reqwest::Client::new()
        .post(server.url("/v1/completions"))
        .header("content-type", "application/json")
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
        .header("content-type", "application/json")
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
    let r = send_json(&url, &body.to_string()).await;
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
    let server = Server::start(&cli(
        "--policy specfit --calibration {} --queue 16",
        &[calibration()],
    ));
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
        .header("content-type", "application/json")
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
    let running = tokio::spawn(stream_once(server.url("/v1/completions"), body.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A streamed request still queued behind it never runs: it is answered 503, not 200.
    let queued = tokio::spawn(stream_once(server.url("/v1/completions"), body));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let status = server.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let _ = running.await;
    assert_eq!(queued.await.unwrap().err(), Some(503));
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
    let want = generate(&cli(
        "--prompt-ids {} --max-tokens 24 --store disk --slots 16 \
            --drafter --policy specfit --calibration {} --routes \
            predictor:models/route-predictor.safetensors",
        &[&prompt, cal],
    ));
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
    let want = generate(&cli(
        "--model {} --prompt {} --chat --store disk --slots 2 --max-tokens 16",
        &[gguf, "What is 12 times 7?"],
    ));
    assert!(!want.is_empty());
    assert_eq!(reply.choices[0].message.content.clone().unwrap(), want);
    assert!(reply.usage.unwrap().prompt_tokens > 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_and_allowed_origins_guard_the_api() {
    let server = Server::start(&cli(
        "--policy ar --api-key sesame --allowed-origin http://chat.example",
        &[],
    ));
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
