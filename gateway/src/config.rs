//! The gateway's configuration (`--gateway-config FILE`, YAML): the model
//! providers (kind, base URL, key from a variable or a file, read once at
//! start, certificates to trust besides the Mozilla roots), each model's price, which workspaces may use which models, and
//! the timeouts of an upstream call. A bad file refuses the start with a
//! message naming the field.
//!
//! ```yaml
//! providers:
//!   anthropic:
//!     kind: anthropic            # or openai, gemini
//!     base_url: https://api.anthropic.com # or http:// (a local proxy)
//!     key_env: ANTHROPIC_API_KEY # or key_file: /run/secrets/anthropic
//!     # ca_file: /etc/troupe/proxy-ca.pem # PEM; trusted besides the
//!     #                                   # Mozilla roots compiled in
//!     allowed_betas: [interleaved-thinking-2025-05-14] # anthropic-beta values
//!     #                          # sent on; the agent's others are dropped
//!     # organization: org-...    # openai: OpenAI-Organization, OpenAI-Project
//!     # project: proj-...        # (the agent's own are never sent)
//!     allow: []                  # server_tools, mcp_servers, remote_content:
//!     #                          # what a body may make the provider do
//!     models:
//!       claude-sonnet-4-5:       # USD per million tokens, as strings
//!         input: "3"
//!         output: "15"
//!         cache_read: "0.30"
//!         cache_write: "3.75"
//!         max_output_tokens: 8192 # a call's bound if it gives none
//! access:
//!   default: ["*"]               # every model; the default
//!   workspaces:
//!     research: [claude-sonnet-4-5]
//! timeouts:                      # milliseconds; these are the defaults
//!   connect_ms: 10000
//!   first_byte_ms: 300000
//!   idle_ms: 300000
//!   drain_ms: 300000             # a stream read on after its client left
//!   body_ms: 30000               # a request body's longest pause
//! ```

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

mod provider;

use self::provider::{Allowed, ProviderHeaders};
pub use self::provider::{HeaderText, Reach};
use super::tls::ExtraRoots;
use troupe_domain::model::{Cost, Price};

/// A provider's API key: read at start, sent upstream only. Its `Debug`
/// and `Display` never show it.
#[derive(Clone)]
pub struct ProviderKey(String);

impl ProviderKey {
    /// The key itself, for the upstream request's header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ProviderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProviderKey(<redacted>)")
    }
}

/// Which API a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Anthropic,
    Openai,
    Gemini,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Openai => "openai",
            ProviderKind::Gemini => "gemini",
        }
    }
}

/// One provider, ready to call.
#[derive(Clone, Debug)]
pub struct Provider {
    pub name: String,
    pub kind: ProviderKind,
    /// `http(s)://HOST[:PORT][/PREFIX]`, without a trailing `/`.
    pub base_url: String,
    pub key: ProviderKey,
    /// Its `ca_file`'s certificates (none without one).
    pub extra_roots: ExtraRoots,
    /// The `anthropic-beta` values sent on (an Anthropic provider's).
    pub allowed_betas: Vec<String>,
    /// `OpenAI-Organization` and `OpenAI-Project`, the operator's (an
    /// OpenAI provider's): the agent's own are never sent.
    pub organization: Option<HeaderText>,
    pub project: Option<HeaderText>,
    /// What a request body may make this provider do besides answering.
    pub allow: Reach,
}

/// A model the gateway serves: its provider and its price.
#[derive(Clone, Debug)]
pub struct ModelEntry {
    pub provider: usize,
    pub price: Price,
    /// The output bound of a call that gives none (OpenAI's
    /// `max_completion_tokens` is optional): the gateway sets it, so the
    /// call's worst case is known.
    pub max_output_tokens: u64,
}

/// [`ModelEntry::max_output_tokens`] unless the model's entry says.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 8192;

/// How long an upstream call may take at each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    /// From the request sent to the answer's headers.
    pub first_byte: Duration,
    /// Between two pieces of the answer's body.
    pub idle: Duration,
    /// How long a stream whose client hung up is read on, for the usage
    /// the provider reports at its end.
    pub drain: Duration,
    /// Longest a request's body may pause between two pieces.
    pub body: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        RawTimeouts::default().checked()
    }
}

/// The gateway's whole configuration, checked.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub providers: Vec<Provider>,
    pub models: HashMap<String, ModelEntry>,
    /// Models of workspaces without a list of their own (`None`: all).
    default_access: Option<Vec<String>>,
    workspaces: HashMap<String, Option<Vec<String>>>,
    pub timeouts: Timeouts,
}

/// A configuration the gateway refuses; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("gateway config {file}: {message}")]
pub struct ConfigError {
    file: String,
    message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    access: RawAccess,
    #[serde(default)]
    timeouts: RawTimeouts,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    kind: ProviderKind,
    base_url: String,
    key_env: Option<String>,
    key_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    #[serde(default)]
    models: BTreeMap<String, RawPrice>,
    #[serde(default)]
    allowed_betas: Vec<String>,
    organization: Option<String>,
    project: Option<String>,
    #[serde(default)]
    allow: Vec<Allowed>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    input: Amount,
    output: Amount,
    #[serde(default)]
    cache_read: Option<Amount>,
    #[serde(default)]
    cache_write: Option<Amount>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
}

/// A price as written: a string (`"0.30"`) or a whole number (`3`).
/// Anything else (a YAML float is not exact) is refused.
#[derive(Deserialize)]
#[serde(untagged)]
enum Amount {
    Text(String),
    Whole(u64),
    Other(serde::de::IgnoredAny),
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccess {
    default: Option<Vec<String>>,
    #[serde(default)]
    workspaces: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTimeouts {
    connect_ms: u64,
    first_byte_ms: u64,
    idle_ms: u64,
    drain_ms: u64,
    body_ms: u64,
}

impl Default for RawTimeouts {
    fn default() -> Self {
        RawTimeouts {
            connect_ms: 10_000,
            first_byte_ms: 300_000,
            idle_ms: 300_000,
            drain_ms: 300_000,
            body_ms: 30_000,
        }
    }
}

impl RawTimeouts {
    fn checked(&self) -> Timeouts {
        Timeouts {
            connect: Duration::from_millis(self.connect_ms),
            first_byte: Duration::from_millis(self.first_byte_ms),
            idle: Duration::from_millis(self.idle_ms),
            drain: Duration::from_millis(self.drain_ms),
            body: Duration::from_millis(self.body_ms),
        }
    }
}

impl GatewayConfig {
    /// Reads and checks `path`, and the providers' keys.
    pub fn load(path: &Path) -> Result<GatewayConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        GatewayConfig::parse(&text, &|name| std::env::var(name).ok())
            .map_err(|message| ConfigError { file, message })
    }

    /// Checks the YAML `text`; `env` reads the variables that hold keys.
    pub fn parse(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<GatewayConfig, String> {
        let raw: RawConfig = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        anyhow_empty(
            raw.providers.is_empty(),
            "providers: at least one provider is needed",
        )?;
        let mut providers = Vec::new();
        let mut models = HashMap::new();
        for (name, p) in raw.providers {
            let field = format!("providers.{name}");
            let base_url = base_url(&p.base_url).map_err(|m| format!("{field}.base_url: {m}"))?;
            let extra_roots = match &p.ca_file {
                None => ExtraRoots::default(),
                Some(_) if !base_url.starts_with("https://") => {
                    return Err(format!(
                        "{field}.ca_file: only an https:// base_url uses certificates"
                    ));
                }
                Some(path) => {
                    ExtraRoots::read(path).map_err(|m| format!("{field}.ca_file: {m}"))?
                }
            };
            let key = read_key(&field, p.key_env.as_deref(), p.key_file.as_deref(), env)?;
            let headers = ProviderHeaders::parse(&field, &p)?;
            let index = providers.len();
            for (model, price) in p.models {
                let field = format!("{field}.models.{model}");
                let max_output = price.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
                anyhow_empty(
                    max_output == 0,
                    &format!("{field}.max_output_tokens: must be at least 1"),
                )?;
                let price = parse_price(&field, &price)?;
                if models
                    .insert(
                        model.clone(),
                        ModelEntry {
                            provider: index,
                            price,
                            max_output_tokens: max_output,
                        },
                    )
                    .is_some()
                {
                    return Err(format!(
                        "{field}: model {model:?} is served by two providers"
                    ));
                }
            }
            providers.push(Provider {
                name,
                kind: p.kind,
                base_url,
                key,
                extra_roots,
                allowed_betas: headers.betas,
                organization: headers.organization,
                project: headers.project,
                allow: Reach::of(&p.allow),
            });
        }
        let known = |field: String, list: Vec<String>| -> Result<Option<Vec<String>>, String> {
            if list.iter().any(|m| m == "*") {
                return Ok(None);
            }
            for m in &list {
                if !models.contains_key(m) {
                    return Err(format!("{field}: no provider serves model {m:?}"));
                }
            }
            Ok(Some(list))
        };
        let default_access = match raw.access.default {
            Some(list) => known("access.default".into(), list)?,
            None => None,
        };
        let mut workspaces = HashMap::new();
        for (ws, list) in raw.access.workspaces {
            let field = format!("access.workspaces.{ws}");
            workspaces.insert(ws, known(field, list)?);
        }
        let t = raw.timeouts;
        for (field, ms) in [
            ("timeouts.connect_ms", t.connect_ms),
            ("timeouts.first_byte_ms", t.first_byte_ms),
            ("timeouts.idle_ms", t.idle_ms),
            ("timeouts.drain_ms", t.drain_ms),
            ("timeouts.body_ms", t.body_ms),
        ] {
            anyhow_empty(ms == 0, &format!("{field}: must be at least 1"))?;
        }
        Ok(GatewayConfig {
            providers,
            models,
            default_access,
            workspaces,
            timeouts: t.checked(),
        })
    }

    /// Whether `workspace` may use `model`.
    pub fn allows(&self, workspace: &str, model: &str) -> bool {
        let list = self
            .workspaces
            .get(workspace)
            .unwrap_or(&self.default_access);
        match list {
            None => self.models.contains_key(model),
            Some(list) => list.iter().any(|m| m == model),
        }
    }

    /// Every provider's key, for checks that none leaks.
    pub fn keys(&self) -> impl Iterator<Item = &ProviderKey> {
        self.providers.iter().map(|p| &p.key)
    }
}

fn anyhow_empty(bad: bool, message: &str) -> Result<(), String> {
    if bad { Err(message.to_owned()) } else { Ok(()) }
}

fn base_url(text: &str) -> Result<String, String> {
    let url = text.trim_end_matches('/');
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with https:// or http://")?;
    if rest.is_empty() || url.parse::<axum::http::Uri>().is_err() {
        return Err(format!("{text:?} is not a URL"));
    }
    Ok(url.to_owned())
}

fn read_key(
    field: &str,
    key_env: Option<&str>,
    key_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ProviderKey, String> {
    let key = match (key_env, key_file) {
        (Some(name), None) => {
            env(name).ok_or_else(|| format!("{field}.key_env: variable {name} is not set"))?
        }
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("{field}.key_file: cannot read {}: {e}", path.display()))?,
        (Some(_), Some(_)) => return Err(format!("{field}: give key_env or key_file, not both")),
        (None, None) => return Err(format!("{field}: key_env or key_file is needed")),
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("{field}: the key is empty"));
    }
    if key.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!(
            "{field}: the key holds spaces or control characters"
        ));
    }
    Ok(ProviderKey(key.to_owned()))
}

fn parse_price(field: &str, raw: &RawPrice) -> Result<Price, String> {
    let one = |name: &str, amount: Option<&Amount>| -> Result<Cost, String> {
        let text = match amount {
            None => return Ok(Cost::ZERO),
            Some(Amount::Text(t)) => t.clone(),
            Some(Amount::Whole(n)) => n.to_string(),
            Some(Amount::Other(_)) => {
                return Err(format!(
                    "{field}.{name}: write the price as a string (\"0.30\") or a whole number, so it is exact"
                ));
            }
        };
        Price::per_million(&text).map_err(|e| format!("{field}.{name}: {text:?}: {e}"))
    };
    Ok(Price {
        input: one("input", Some(&raw.input))?,
        output: one("output", Some(&raw.output))?,
        cache_read: one("cache_read", raw.cache_read.as_ref())?,
        cache_write: one("cache_write", raw.cache_write.as_ref())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
providers:
  anthropic:
    kind: anthropic
    base_url: http://127.0.0.1:9/
    key_env: THE_KEY
    models:
      claude-a: { input: "3", output: 15, cache_read: "0.30", cache_write: "3.75" }
      claude-b: { input: "1", output: "5" }
access:
  workspaces:
    narrow: [claude-b]
"#;

    fn env(name: &str) -> Option<String> {
        (name == "THE_KEY").then(|| "sk-secret-123".to_owned())
    }

    fn refused(text: &str) -> String {
        GatewayConfig::parse(text, &env).expect_err("refused")
    }

    #[test]
    fn a_good_config_reads_prices_keys_and_access() {
        let c = GatewayConfig::parse(GOOD, &env).unwrap();
        let a = &c.models["claude-a"];
        assert_eq!(a.price.input, Cost(3_000_000));
        assert_eq!(a.price.output, Cost(15_000_000));
        assert_eq!(a.price.cache_read, Cost(300_000));
        assert_eq!(a.price.cache_write, Cost(3_750_000));
        assert_eq!(c.models["claude-b"].price.cache_write, Cost::ZERO);
        assert_eq!(c.providers[0].base_url, "http://127.0.0.1:9");
        assert_eq!(c.providers[0].key.expose(), "sk-secret-123");
        assert!(c.allows("any", "claude-a"));
        assert!(!c.allows("any", "claude-zzz"));
        assert!(c.allows("narrow", "claude-b"));
        assert!(!c.allows("narrow", "claude-a"));
        assert_eq!(c.timeouts.idle, Duration::from_secs(300));
    }

    #[test]
    fn the_key_never_shows_in_debug() {
        let c = GatewayConfig::parse(GOOD, &env).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("sk-secret-123"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn bad_configs_are_refused_naming_the_field() {
        let cases = [
            (
                GOOD.replace("key_env: THE_KEY", "key_env: NOT_SET"),
                "providers.anthropic.key_env: variable NOT_SET is not set",
            ),
            (
                GOOD.replace("key_env: THE_KEY", ""),
                "providers.anthropic: key_env or key_file is needed",
            ),
            (
                GOOD.replace("output: 15", "output: 1.5"),
                "providers.anthropic.models.claude-a.output: write the price as a string",
            ),
            (
                GOOD.replace("\"0.30\"", "\"0.0000001\""),
                "providers.anthropic.models.claude-a.cache_read",
            ),
            (
                GOOD.replace("\"0.30\"", "\"-1\""),
                "providers.anthropic.models.claude-a.cache_read",
            ),
            (
                GOOD.replace("http://127.0.0.1:9/", "ftp://api.example"),
                "providers.anthropic.base_url: must start with https:// or http://",
            ),
            (
                GOOD.replace("http://127.0.0.1:9/", "https://api example"),
                "providers.anthropic.base_url: \"https://api example\" is not a URL",
            ),
            (GOOD.replace("kind: anthropic", "kind: cohere"), "kind"),
            (
                GOOD.replace("[claude-b]", "[claude-c]"),
                "access.workspaces.narrow: no provider serves model \"claude-c\"",
            ),
            (
                format!("{GOOD}timeouts: {{ idle_ms: 0 }}\n"),
                "timeouts.idle_ms: must be at least 1",
            ),
            (format!("{GOOD}extra: 1\n"), "unknown field `extra`"),
            (
                "providers: {}\n".to_owned(),
                "providers: at least one provider is needed",
            ),
        ];
        for (text, want) in cases {
            let got = refused(&text);
            assert!(got.contains(want), "wanted {want:?} in {got:?}");
            assert!(!got.contains("sk-secret-123"), "{got}");
        }
    }

    fn with_ca(base_url: &str, ca_file: &Path) -> String {
        GOOD.replace("http://127.0.0.1:9/", base_url).replace(
            "key_env: THE_KEY",
            &format!("key_env: THE_KEY\n    ca_file: {}", ca_file.display()),
        )
    }

    #[test]
    fn https_is_accepted_and_a_ca_file_adds_its_certificates() {
        let c = GatewayConfig::parse(&GOOD.replace("http://", "https://"), &env).unwrap();
        assert_eq!(c.providers[0].base_url, "https://127.0.0.1:9");
        assert!(c.providers[0].extra_roots.is_empty());

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let pem = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.self_signed(&key).unwrap().pem()
        };
        std::fs::write(&ca, pem("one") + &pem("two")).unwrap();
        let c = GatewayConfig::parse(&with_ca("https://api.example", &ca), &env).unwrap();
        let shown = format!("{:?}", c.providers[0].extra_roots);
        assert_eq!(shown, "ExtraRoots(2 certificates)");
    }

    /// A `ca_file` missing, empty, not PEM, holding no certificate or one
    /// that is not a certificate, or given to an `http://` provider.
    #[test]
    fn bad_ca_files_are_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let missing = dir.path().join("missing.pem");
        let empty = file("empty.pem", "");
        let key_only = file(
            "key.pem",
            &rcgen::KeyPair::generate().unwrap().serialize_pem(),
        );
        let broken = file(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
        );
        let unterminated = file("cut.pem", "-----BEGIN CERTIFICATE-----\nbm90\n");
        let field = "providers.anthropic.ca_file: ";
        let cases = [
            (with_ca("https://api.example", &missing), "cannot read"),
            (
                with_ca("https://api.example", &empty),
                "holds no certificate",
            ),
            (
                with_ca("https://api.example", &key_only),
                "holds no certificate",
            ),
            (
                with_ca("https://api.example", &broken),
                "certificate 1 is not usable",
            ),
            (with_ca("https://api.example", &unterminated), "is not PEM"),
            (
                with_ca("http://127.0.0.1:9", &empty),
                "only an https:// base_url",
            ),
        ];
        for (text, want) in cases {
            let got = refused(&text);
            assert!(got.starts_with(field), "wanted {field:?} in {got:?}");
            assert!(got.contains(want), "wanted {want:?} in {got:?}");
        }
    }
}
