//! Chat messages rendered into one prompt string with the model's own Jinja chat template
//! (`tokenizer_config.json`'s `chat_template`, or the GGUF's), through `minijinja` configured as
//! `transformers` configures Jinja for chat templates: `trim_blocks`, `lstrip_blocks`, loop
//! controls, Python string methods, `raise_exception`. A model without a template gets ChatML.
//! It does not tokenize and does not check roles beyond what the template itself checks.

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::error::{ApiError, ServerError};

/// One chat message as the template sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// A compiled chat template, or the ChatML fallback.
pub struct ChatTemplate {
    env: Option<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("jinja", &self.env.is_some())
            .finish()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` (None: ChatML); `bos_token`/`eos_token` are the texts templates may
    /// reference.
    pub fn new(
        source: Option<&str>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, ServerError> {
        let env = match source {
            None => None,
            Some(source) => {
                let mut env = Environment::new();
                env.set_syntax(
                    minijinja::syntax::SyntaxConfig::builder()
                        .trim_blocks(true)
                        .lstrip_blocks(true)
                        .build()
                        .map_err(|e| ServerError::Template(e.to_string()))?,
                );
                env.set_unknown_method_callback(
                    minijinja_contrib::pycompat::unknown_method_callback,
                );
                env.add_function(
                    "raise_exception",
                    |message: String| -> Result<Value, minijinja::Error> {
                        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
                    },
                );
                env.add_template_owned(NAME, source.to_string())
                    .map_err(|e| ServerError::Template(describe(&e)))?;
                Some(env)
            }
        };
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    /// Whether the model's own template is used (false: ChatML).
    pub fn is_jinja(&self) -> bool {
        self.env.is_some()
    }

    /// The prompt for `messages` followed by the assistant's turn. `kwargs` are extra template
    /// variables (`chat_template_kwargs`, e.g. `enable_thinking`); they cannot replace
    /// `messages`. A template that refuses the conversation (`raise_exception`) is a 400.
    pub fn render(
        &self,
        messages: &[Message],
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ApiError> {
        let Some(env) = &self.env else {
            return Ok(chatml(messages));
        };
        let mut vars = kwargs.clone();
        vars.insert("add_generation_prompt".into(), true.into());
        vars.insert("bos_token".into(), self.bos_token.clone().into());
        vars.insert("eos_token".into(), self.eos_token.clone().into());
        vars.insert(
            "messages".into(),
            serde_json::to_value(messages).expect("messages serialize"),
        );
        let template = env.get_template(NAME).expect("compiled in new");
        template
            .render(Value::from(minijinja::value::Serde(vars)))
            .map_err(|e| {
                ApiError::invalid(
                    "messages",
                    format!(
                        "the model's chat template refused the messages: {}",
                        describe(&e)
                    ),
                )
            })
    }
}

/// Qwen's ChatML: `<|im_start|>role\ncontent<|im_end|>\n` per message, then the assistant's turn.
fn chatml(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// A template error as one line: its detail (what `raise_exception` said) or its kind.
fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(d) => format!("{d} ({})", e.kind()),
        None => e.kind().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    fn no_kwargs() -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }

    /// The shipped target's template, as its tokenizer_config.json holds it.
    fn shipped_template() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/target/tokenizer_config.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["chat_template"].as_str().unwrap().to_string()
    }

    #[test]
    fn the_shipped_template_renders_what_the_chatml_fallback_renders() {
        let t = ChatTemplate::new(Some(&shipped_template()), None, Some("<|im_end|>")).unwrap();
        assert!(t.is_jinja());
        let fallback = ChatTemplate::new(None, None, None).unwrap();
        let messages = [
            msg("system", "You are terse."),
            msg("user", "What is 12 times 7?"),
            msg("assistant", "84."),
            msg("user", "And {{ 1 + 1 }} {% raw %}?"),
        ];
        for n in 1..=messages.len() {
            let got = t.render(&messages[..n], &no_kwargs()).unwrap();
            assert_eq!(got, fallback.render(&messages[..n], &no_kwargs()).unwrap());
        }
        assert_eq!(
            t.render(&messages[1..2], &no_kwargs()).unwrap(),
            "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_template_using_python_methods_loop_controls_and_kwargs_renders_like_jinja() {
        // In the style of Qwen3's own template: namespace, string methods, loop.last, kwargs.
        let source = "{%- set ns = namespace(sys='') -%}\n\
            {%- for m in messages %}\n\
            {%- if m.role == 'system' %}{% set ns.sys = m.content.strip() %}{% continue %}{% endif %}\n\
            <{{ m.role|upper }}>{{ m.content.lstrip('\\n').replace('x', 'y') }}{% if loop.last %}!{% endif %}\n\
            {% endfor %}\n\
            {%- if ns.sys %}[{{ ns.sys }}]{% endif %}\n\
            {%- if enable_thinking is defined and enable_thinking is false %}<no-think>{% endif %}\n\
            {{- bos_token }}";
        let t = ChatTemplate::new(Some(source), Some("<s>"), None).unwrap();
        let messages = [
            msg("system", "  be brief "),
            msg("user", "\nxx"),
            msg("assistant", "ok"),
        ];
        let mut kwargs = no_kwargs();
        kwargs.insert("enable_thinking".into(), false.into());
        // What Jinja2 renders with transformers' settings (trim_blocks eats the newline after
        // `{% endif %}`; checked with jinja2 3.1's ImmutableSandboxedEnvironment).
        assert_eq!(
            t.render(&messages, &kwargs).unwrap(),
            "<USER>yy<ASSISTANT>ok![be brief]<no-think><s>"
        );
    }

    #[test]
    fn a_template_that_raises_is_a_bad_request_naming_its_reason() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(Some(source), None, None).unwrap();
        let e = t
            .render(&[msg("assistant", "hi")], &no_kwargs())
            .unwrap_err();
        assert_eq!(e.status, 400);
        assert!(
            e.message.contains("Conversation must start with user"),
            "{e}"
        );
        assert_eq!(t.render(&[msg("user", "hi")], &no_kwargs()).unwrap(), "ok");
    }

    #[test]
    fn a_template_that_does_not_compile_is_refused_at_start() {
        let e = ChatTemplate::new(Some("{% for m in messages %}"), None, None).unwrap_err();
        assert!(matches!(e, ServerError::Template(_)), "{e}");
    }
}
