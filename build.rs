//! The commit the crate is built from, as `PHONES_GATEWAY_COMMIT` for
//! `--version`, the start log and `phones_gateway_build_info`
//! (`telemetry::COMMIT`): the variable of that name if the build is given one
//! (the Dockerfile's build argument: its context has no `.git`), else
//! `git rev-parse --short HEAD`, else "unknown" (no git, no repository).
//! Rerun only when HEAD moves: on `.git/HEAD`, the branch it names and the
//! packed refs, those of them that exist (a path that does not exist would
//! rerun it at every build).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=PHONES_GATEWAY_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let given = std::env::var("PHONES_GATEWAY_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    let commit = given
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PHONES_GATEWAY_COMMIT={commit}");
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
