//! A provider's own fields beside its key and models: the request
//! headers the operator sets or allows (`allowed_betas`, an OpenAI
//! `organization` and `project`), and what a request may make it do
//! (`allow`, [`Reach`]).

use serde::Deserialize;

use super::{ProviderKind, RawProvider};

/// A configured header value: visible ASCII, no commas or spaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderText(String);

impl HeaderText {
    fn parse(field: &str, text: &str) -> Result<HeaderText, String> {
        let ok = !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic() && b != b',');
        if ok {
            Ok(HeaderText(text.to_owned()))
        } else {
            Err(format!(
                "{field}: {text:?} is not a header value (visible ASCII, no commas)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a request may make a provider do beyond answering from the request
/// itself, each refused unless the provider's `allow` lists it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// Tools the provider runs itself (web search and fetch, code
    /// execution, computer use...): any tool whose `type` is not a custom
    /// or function tool's; Anthropic's `container`, OpenAI's
    /// `web_search_options`.
    pub server_tools: bool,
    /// Anthropic's MCP connector (`mcp_servers`): the provider calls them.
    pub mcp_servers: bool,
    /// Content the provider fetches or looks up: images and documents by
    /// URL, files by id.
    pub remote_content: bool,
}

/// One of [`Reach`]'s, as `allow` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Allowed {
    ServerTools,
    McpServers,
    RemoteContent,
}

impl Reach {
    pub(super) fn of(list: &[Allowed]) -> Reach {
        Reach {
            server_tools: list.contains(&Allowed::ServerTools),
            mcp_servers: list.contains(&Allowed::McpServers),
            remote_content: list.contains(&Allowed::RemoteContent),
        }
    }
}

/// A provider's own request headers, checked against its kind.
pub(super) struct ProviderHeaders {
    pub(super) betas: Vec<String>,
    pub(super) organization: Option<HeaderText>,
    pub(super) project: Option<HeaderText>,
}

impl ProviderHeaders {
    pub(super) fn parse(field: &str, p: &RawProvider) -> Result<ProviderHeaders, String> {
        let anthropic = p.kind == ProviderKind::Anthropic;
        if !anthropic && !p.allowed_betas.is_empty() {
            return Err(format!(
                "{field}.allowed_betas: only an anthropic provider takes anthropic-beta"
            ));
        }
        for (name, given) in [("organization", &p.organization), ("project", &p.project)] {
            if p.kind != ProviderKind::Openai && given.is_some() {
                return Err(format!("{field}.{name}: only an openai provider has one"));
            }
        }
        let betas = p
            .allowed_betas
            .iter()
            .map(|b| HeaderText::parse(&format!("{field}.allowed_betas"), b).map(|b| b.0))
            .collect::<Result<_, _>>()?;
        let text = |name: &str, v: &Option<String>| {
            v.as_deref()
                .map(|v| HeaderText::parse(&format!("{field}.{name}"), v))
                .transpose()
        };
        Ok(ProviderHeaders {
            betas,
            organization: text("organization", &p.organization)?,
            project: text("project", &p.project)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::GatewayConfig;

    const BOTH: &str = r#"
providers:
  a:
    kind: anthropic
    base_url: http://127.0.0.1:9
    key_env: K
    allowed_betas: [beta-1, beta-2]
    allow: [server_tools]
    models: { m: { input: "1", output: "1" } }
  o:
    kind: openai
    base_url: http://127.0.0.1:9
    key_env: K
    organization: org-1
    project: proj-1
    allow: [mcp_servers, remote_content]
    models: { g: { input: "1", output: "1" } }
"#;

    fn parse(text: &str) -> Result<GatewayConfig, String> {
        GatewayConfig::parse(text, &|_| Some("sk-1".to_owned()))
    }

    #[test]
    fn a_providers_headers_and_reach_are_read() {
        let c = parse(BOTH).unwrap();
        let (a, o) = (&c.providers[0], &c.providers[1]);
        assert_eq!(a.allowed_betas, ["beta-1", "beta-2"]);
        assert!(a.allow.server_tools && !a.allow.mcp_servers && !a.allow.remote_content);
        assert_eq!(o.organization.as_ref().unwrap().as_str(), "org-1");
        assert_eq!(o.project.as_ref().unwrap().as_str(), "proj-1");
        assert!(!o.allow.server_tools && o.allow.mcp_servers && o.allow.remote_content);
    }

    #[test]
    fn headers_of_the_wrong_kind_or_shape_are_refused_naming_the_field() {
        let cases = [
            (
                BOTH.replace(
                    "    organization: org-1\n",
                    "    organization: org-1\n    allowed_betas: [x]\n",
                ),
                "providers.o.allowed_betas: only an anthropic provider",
            ),
            (
                BOTH.replace("    allow: [server_tools]\n", "    project: p\n"),
                "providers.a.project: only an openai provider",
            ),
            (
                BOTH.replace("org-1", "\"org 1\""),
                "providers.o.organization: \"org 1\" is not a header value",
            ),
            (
                BOTH.replace("beta-2", "\"b,c\""),
                "providers.a.allowed_betas",
            ),
            (
                BOTH.replace("[server_tools]", "[everything]"),
                "unknown variant",
            ),
        ];
        for (text, want) in cases {
            let got = parse(&text).expect_err("refused");
            assert!(got.contains(want), "wanted {want:?} in {got:?}");
        }
    }
}
