//! Who may call the API, checked before any handler runs: the API key (`Authorization: Bearer`,
//! scheme matched case-insensitively), the `Host` header (a server on a loopback address answers
//! only loopback names, so a DNS-rebinding web page cannot read it, as Jupyter and Ollama do), and
//! the web origins CORS lets in. The settings are validated when the server starts. It does not
//! look at request bodies.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ServerError};
use crate::http::App;

/// Who may call the API.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// When set, every `/v1/` request needs `Authorization: Bearer KEY` (401 otherwise);
    /// `/health` and `/metrics` stay open.
    pub api_key: Option<String>,
    /// Origins whose web pages may call the API from a browser (CORS; `*` for any). Empty:
    /// none (a page on another site cannot read the answers).
    pub allowed_origins: Vec<String>,
    /// Host names (and IPs) requests may name in `Host`; `None`: any. `*` in the list: any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Bound to a loopback address: every loopback IP in `Host` is answered too.
    pub loopback: bool,
}

impl Access {
    /// Checks the settings of a server bound to `bind` (an IP or host name): a key of visible
    /// ASCII, origins written `scheme://host[:port]` (or `*`), host names without scheme, path or
    /// port. A loopback bind answers loopback names plus `allowed_hosts`; another bind answers
    /// any `Host` unless `allowed_hosts` names some.
    pub fn new(
        api_key: Option<String>,
        allowed_origins: Vec<String>,
        allowed_hosts: Vec<String>,
        bind: &str,
    ) -> Result<Access, ServerError> {
        if let Some(key) = &api_key {
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ServerError::Access(
                    "--api-key must be one or more visible ASCII characters (no spaces)".into(),
                ));
            }
        }
        for origin in &allowed_origins {
            if origin != "*" && !is_origin(origin) {
                return Err(ServerError::Access(format!(
                    "--allowed-origin {origin:?} is not an origin: write scheme://host[:port] \
                     (e.g. http://localhost:3000, no path or trailing slash) or *"
                )));
            }
        }
        for host in &allowed_hosts {
            if host != "*" && !is_host_name(host) {
                return Err(ServerError::Access(format!(
                    "--allowed-host {host:?} is not a host name: write it as it appears in a \
                     URL, without scheme, port or path (e.g. myserver.lan), or *"
                )));
            }
        }
        let loopback = is_loopback(bind);
        let allowed_hosts = if loopback {
            // Loopback IPs are answered through `loopback`.
            let mut names = vec!["localhost".to_string()];
            names.extend(allowed_hosts.iter().map(|h| h.to_ascii_lowercase()));
            Some(names)
        } else if allowed_hosts.is_empty() {
            None
        } else {
            Some(
                allowed_hosts
                    .iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect(),
            )
        };
        Ok(Access {
            api_key,
            allowed_origins,
            allowed_hosts,
            loopback,
        })
    }

    /// Whether a request naming `host` (the `Host` header, port and all) may be answered.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(allowed) = &self.allowed_hosts else {
            return true;
        };
        let Some(name) = host.map(host_name) else {
            return false;
        };
        let loopback_ip = name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        allowed.iter().any(|a| a == "*" || *a == name) || self.loopback && loopback_ip
    }
}

/// Whether `bind` is a loopback address or `localhost`.
fn is_loopback(bind: &str) -> bool {
    bind.eq_ignore_ascii_case("localhost")
        || bind
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `scheme://host[:port]`, nothing after.
fn is_origin(text: &str) -> bool {
    let Some((scheme, rest)) = text.split_once("://") else {
        return false;
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    scheme_ok
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@'])
        && rest.bytes().all(|b| b.is_ascii_graphic())
        && HeaderValue::from_str(text).is_ok()
}

/// A DNS name or an IP, without scheme, port or path.
fn is_host_name(text: &str) -> bool {
    text.parse::<IpAddr>().is_ok()
        || !text.is_empty()
            && text.len() <= 253
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

/// The name in a `Host` header value: lowercased, without its port or IPv6 brackets.
fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Refuses requests whose `Host` the server does not answer to with a 403.
pub(crate) async fn check_host(
    State(app): State<Arc<App>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if app.access.host_allowed(host) {
        return next.run(req).await;
    }
    ApiError::request(
        403,
        format!(
            "this server does not answer to the host {:?}; start it with --allowed-host NAME to \
             allow a name",
            host.unwrap_or("")
        ),
    )
    .with_kind("permission_error")
    .into_response()
}

/// Refuses `/v1/` requests without the API key (when one is set) with a 401.
pub(crate) async fn authorize(
    State(app): State<Arc<App>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(key) = &app.access.api_key else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    if given == Some(key.as_str()) {
        return next.run(req).await;
    }
    ApiError::request(401, "a valid API key is needed: Authorization: Bearer KEY")
        .with_kind("invalid_request_error")
        .with_code("invalid_api_key")
        .into_response()
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme in any case, RFC 7235).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// The CORS layer for `origins` (`*`: any), or None when no origin is allowed.
pub(crate) fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(hosts: &[&str], bind: &str) -> Access {
        let hosts = hosts.iter().map(|h| h.to_string()).collect();
        Access::new(None, vec![], hosts, bind).unwrap()
    }

    #[test]
    fn a_loopback_server_answers_loopback_names_and_the_allowed_hosts_only() {
        let a = access(&["myserver.lan"], "127.0.0.1");
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8080",
            "127.0.0.2",
            "myserver.lan:80",
        ] {
            assert!(a.host_allowed(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "",
            "localhost.evil",
        ] {
            assert!(!a.host_allowed(Some(bad)), "{bad}");
        }
        assert!(!a.host_allowed(None));
    }

    #[test]
    fn a_server_on_all_interfaces_answers_any_host_unless_hosts_are_named() {
        assert!(access(&[], "0.0.0.0").host_allowed(Some("anything:1")));
        let a = access(&["api.lan"], "0.0.0.0");
        assert!(a.host_allowed(Some("api.lan")));
        assert!(!a.host_allowed(Some("localhost")));
    }

    #[test]
    fn bad_keys_origins_and_hosts_are_refused_at_start() {
        for key in ["", "two words", "tab\there", "ключ"] {
            assert!(
                Access::new(Some(key.into()), vec![], vec![], "127.0.0.1").is_err(),
                "{key:?}"
            );
        }
        for origin in [
            "localhost:3000",
            "http://x/",
            "http://x/path",
            "not an origin",
            "http://",
        ] {
            let err = Access::new(None, vec![origin.into()], vec![], "127.0.0.1");
            assert!(err.is_err(), "{origin:?}");
        }
        for origin in [
            "*",
            "http://localhost:3000",
            "https://app.example.com",
            "vscode-webview://abc",
        ] {
            assert!(
                Access::new(None, vec![origin.into()], vec![], "127.0.0.1").is_ok(),
                "{origin}"
            );
        }
        for host in ["http://x", "x:80", "x/y", ""] {
            assert!(
                Access::new(None, vec![], vec![host.into()], "127.0.0.1").is_err(),
                "{host:?}"
            );
        }
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        assert_eq!(bearer_token("Bearer k"), Some("k"));
        assert_eq!(bearer_token("bearer k"), Some("k"));
        assert_eq!(bearer_token("BEARER  k"), Some("k"));
        assert_eq!(bearer_token("Basic k"), None);
        assert_eq!(bearer_token("Bearerk"), None);
    }
}
