//! Agent CLIs as Troupe agents: the image `scripts/build-agent-image`
//! makes ([`agents_image`]), the CLIs it holds, and the example definition
//! of each runtime with the model a test's gateway serves ([`example`]).

use std::path::Path;

/// The image holding the agent CLIs and the CLIs it holds (`codex`,
/// `gemini-cli`, ...); `None` when no registry could be reached. Built once
/// per process: the tests of the agent CLIs wait for the one build.
pub fn agents_image() -> Option<(String, Vec<String>)> {
    static IMAGE: std::sync::OnceLock<Option<(String, Vec<String>)>> = std::sync::OnceLock::new();
    IMAGE.get_or_init(build).clone()
}

fn build() -> Option<(String, Vec<String>)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-agent-image");
    let out = std::process::Command::new(script)
        .output()
        .expect("run scripts/build-agent-image");
    match out.status.code() {
        Some(0) => {}
        Some(3) => {
            eprintln!(
                "SKIPPED: the agent CLIs image cannot be built, no registry is reachable:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        _ => panic!(
            "scripts/build-agent-image failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
    let image = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .expect("the image's tag")
        .to_owned();
    let label = std::process::Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"org.troupe.clis\"}}",
            &image,
        ])
        .output()
        .expect("docker image inspect");
    let clis = String::from_utf8_lossy(&label.stdout)
        .trim()
        .split(',')
        .filter_map(|cli| cli.split('@').next())
        .map(str::to_owned)
        .collect();
    Some((image, clis))
}

/// `examples/agents/FILE.md` with its `model` set to `model`.
pub fn example(file: &str, model: &str) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/agents/{file}.md")),
    )
    .unwrap_or_else(|e| panic!("examples/agents/{file}.md: {e}"));
    with_model(&text, model)
}

/// An agent file with its `model:` line naming `model`.
pub fn with_model(text: &str, model: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with("model: "))
        .expect("the example names its model");
    text.replacen(line, &format!("model: {model}"), 1)
}

/// The provider key the gateway holds, never in a container.
pub const KEY: &str = "sk-provider-key-never-in-a-container-5f2e";

/// A model of the gateway and where its provider is: the provider's name
/// and kind (`anthropic`, `openai`, `gemini`) and the scripted upstream's
/// base URL. It costs $2/M input and $8/M output tokens.
pub struct Route<'a> {
    pub provider: &'a str,
    pub kind: &'a str,
    pub model: &'a str,
    pub url: String,
}

/// Writes [`KEY`] and a gateway configuration of `routes` to `dir`; returns
/// the configuration's path.
pub fn gateway_config(dir: &Path, routes: &[Route]) -> std::path::PathBuf {
    let key = dir.join("key");
    std::fs::write(&key, KEY).unwrap();
    let mut yaml = "providers:\n".to_owned();
    for route in routes {
        yaml.push_str(&format!(
            "  {provider}:\n    kind: {kind}\n    base_url: {url}\n    key_file: {key}\n    \
             models:\n      {model}: {{ input: \"2\", output: \"8\", max_output_tokens: 4096 }}\n",
            provider = route.provider,
            kind = route.kind,
            url = route.url,
            key = key.display(),
            model = route.model,
        ));
    }
    let file = dir.join("gateway.yaml");
    std::fs::write(&file, yaml).unwrap();
    file
}

/// The gateway provider kind a runtime's CLI calls.
pub fn provider_kind(agent: &str) -> &'static str {
    match agent {
        "claude" => "anthropic",
        "gemini" => "gemini",
        _ => "openai",
    }
}
