//! Agent CLIs as Troupe agents: the image `scripts/build-agent-image`
//! makes ([`agents_image`]), the CLIs it holds, and the example definition
//! of each runtime with the model a test's gateway serves ([`example`]).

use std::path::Path;

/// The image holding the agent CLIs and the CLIs it holds (`codex`,
/// `gemini-cli`, ...); `None` when no registry could be reached.
pub fn agents_image() -> Option<(String, Vec<String>)> {
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
