//! Generates the `sluice.v1` messages and tonic services from `sluice/v1/sluice.proto`, with the
//! vendored protoc so that a fresh machine needs no protoc installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: `set_var` requires that no other thread reads or writes the environment at the same
    // time; this build script has started no thread.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=sluice/v1/sluice.proto");
    tonic_prost_build::configure().compile_protos(&["sluice/v1/sluice.proto"], &["."])?;
    Ok(())
}
