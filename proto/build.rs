//! Generates the gRPC code of both services and the descriptor set that
//! server reflection serves. Uses `$PROTOC` when set, else a vendored protoc.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    let protoc = match env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    config.protoc_executable(protoc);
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("troupe_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                "troupe/session/v1/session.proto",
                "troupe/runner/v1/runner.proto",
            ],
            &["."],
        )?;
    println!("cargo:rerun-if-changed=troupe");
    Ok(())
}
