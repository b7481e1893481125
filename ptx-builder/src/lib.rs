//! Compiles a kernel crate to PTX with rustc's own NVPTX backend.
//!
//! Call [`PtxBuilder`] from a `build.rs`: it runs a nested
//! `cargo rustc --target nvptx64-nvidia-cuda -Zbuild-std=core,panic_abort
//! --crate-type cdylib` on the kernel crate and returns the path of the `.ptx`
//! file, which the caller embeds with `include_str!`.
//!
//! Three details make the nested build safe inside an outer one:
//! - it uses its own target directory, so it never waits on the lock the outer
//!   build holds on `target/`;
//! - `RUSTC_BOOTSTRAP=1` is set for that one invocation only (build-std and the
//!   `abi_ptx` / `asm_experimental_arch` features need it), never exported to
//!   the outer build;
//! - flags and wrappers of the outer build (`RUSTFLAGS`, clippy's
//!   `RUSTC_WORKSPACE_WRAPPER`, coverage flags…) are removed, and
//!   `-Ctarget-cpu` is passed to every crate of the nested build, `core`
//!   included.
//!
//! Before building it checks that the toolchain has the components the NVPTX
//! path needs and, if one is missing, fails with the `rustup` command that
//! installs it.

use std::env;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rustc target triple of NVIDIA's PTX.
pub const NVPTX_TARGET: &str = "nvptx64-nvidia-cuda";

/// The default virtual architecture: one PTX serves A100, H100 and H200 (the
/// driver compiles it for the GPU at load time).
pub const DEFAULT_ARCH: &str = "sm_80";

/// Environment variable that overrides the architecture of every PTX build.
pub const ARCH_ENV: &str = "GPUMALLOC_PTX_ARCH";

/// Build-time settings of the allocator crate `gpu-kernel` (read there with
/// `option_env!`). They change the heap's layout, so every PTX build of a
/// crate over the allocator, and every host build that lays heaps out, must
/// see the same values: [`PtxBuilder::build`] prints the rerun lines for
/// them ([`rerun_if_allocator_settings_change`]), so cargo rebuilds the PTX
/// of a user's crate when one changes.
pub const ALLOCATOR_SETTINGS: &[&str] = &gpu_kernel::fingerprint::SETTINGS;

/// Prints a `cargo:rerun-if-env-changed` line for each of
/// [`ALLOCATOR_SETTINGS`] (call it from a `build.rs`).
pub fn rerun_if_allocator_settings_change() {
    for setting in ALLOCATOR_SETTINGS {
        println!("cargo:rerun-if-env-changed={setting}");
    }
}

/// Why a PTX build failed.
#[derive(Debug)]
pub enum BuildError {
    /// A toolchain component is missing; the message holds the install command.
    MissingComponent {
        /// The rustup component name.
        component: &'static str,
        /// The file whose absence showed it.
        looked_for: PathBuf,
        /// The toolchain the build runs with.
        toolchain: String,
    },
    /// A command could not be started.
    Spawn {
        /// What was being run.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The nested cargo build failed.
    Cargo {
        /// The command line.
        command: String,
        /// Its standard error.
        stderr: String,
    },
    /// The build succeeded but left no PTX where expected.
    NoPtx(PathBuf),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::MissingComponent {
                component,
                looked_for,
                toolchain,
            } => write!(
                f,
                "the Rust toolchain lacks the `{component}` component needed to compile \
                 kernels for {NVPTX_TARGET} (looked for {}); install it with \
                 `rustup component add --toolchain {toolchain} {component}`",
                looked_for.display()
            ),
            BuildError::Spawn { what, source } => write!(f, "could not run {what}: {source}"),
            BuildError::Cargo { command, stderr } => {
                write!(f, "PTX build failed: {command}\n{stderr}")
            }
            BuildError::NoPtx(p) => write!(f, "PTX build left no file at {}", p.display()),
        }
    }
}

impl std::error::Error for BuildError {}

/// A PTX build of one kernel crate.
#[derive(Debug, Clone)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: String,
    target_dir: Option<PathBuf>,
    features: Vec<String>,
}

impl PtxBuilder {
    /// A build of the crate whose `Cargo.toml` is in `crate_dir`, for the
    /// architecture named by `GPUMALLOC_PTX_ARCH` or else [`DEFAULT_ARCH`].
    pub fn new(crate_dir: impl Into<PathBuf>) -> Self {
        let arch = env::var(ARCH_ENV).unwrap_or_else(|_| DEFAULT_ARCH.to_string());
        PtxBuilder {
            crate_dir: crate_dir.into(),
            arch,
            target_dir: None,
            features: Vec::new(),
        }
    }

    /// Sets the virtual architecture (`sm_80`, `sm_90`, …).
    pub fn arch(mut self, arch: &str) -> Self {
        self.arch = arch.to_string();
        self
    }

    /// Sets the nested build's target directory (default: `$OUT_DIR/ptx-target`).
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// Enables a cargo feature of the kernel crate.
    pub fn feature(mut self, name: &str) -> Self {
        self.features.push(name.to_string());
        self
    }

    /// Builds the crate and returns the path of its PTX. From a build script
    /// it also prints the `rerun-if` lines for the crate's sources.
    pub fn build(&self) -> Result<PathBuf, BuildError> {
        let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
        let toolchain = Toolchain::probe(&rustc)?;
        toolchain.check_components()?;

        let target_dir = match &self.target_dir {
            Some(d) => d.clone(),
            None => PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| "target".into()))
                .join("ptx-target"),
        };
        let manifest = self.crate_dir.join("Cargo.toml");
        let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(&cargo);
        cmd.arg("rustc")
            .arg("--manifest-path")
            .arg(&manifest)
            .args(["--release", "--target", NVPTX_TARGET])
            .arg("-Zbuild-std=core,panic_abort")
            .args(["--crate-type", "cdylib"])
            .arg("--target-dir")
            .arg(&target_dir);
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        for var in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_MAKEFLAGS",
            "CARGO_LLVM_COV",
            "RUSTDOCFLAGS",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("RUSTC_BOOTSTRAP", "1").env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("-Ctarget-cpu={}", self.arch),
        );
        let command = format!("{cmd:?}");
        let out = cmd.output().map_err(|source| BuildError::Spawn {
            what: cargo.clone(),
            source,
        })?;
        if !out.status.success() {
            return Err(BuildError::Cargo {
                command,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let lib_name = crate_lib_name(&manifest)?;
        let ptx = target_dir
            .join(NVPTX_TARGET)
            .join("release")
            .join(format!("{lib_name}.ptx"));
        if !ptx.exists() {
            return Err(BuildError::NoPtx(ptx));
        }
        if env::var_os("OUT_DIR").is_some() {
            // The allocator's settings shape the heap layout this PTX was
            // built for: a build script that embeds it reruns when one
            // changes, whether or not it also calls
            // `rerun_if_allocator_settings_change` itself.
            rerun_if_allocator_settings_change();
            println!("cargo:rerun-if-changed={}", manifest.display());
            println!("cargo:rerun-if-env-changed={ARCH_ENV}");
            // Every source the build read, the path crates the kernel crate
            // depends on included (the allocator crate a user's kernels
            // link): cargo's own dep-info of the PTX build lists them.
            let dep_info = ptx.with_extension("d");
            match std::fs::read_to_string(&dep_info) {
                Ok(text) => {
                    for path in dep_info_sources(&text) {
                        println!("cargo:rerun-if-changed={path}");
                    }
                }
                Err(_) => rerun_if_changed_tree(&self.crate_dir),
            }
        }
        Ok(ptx)
    }
}

/// The sysroot and host of the rustc that runs the build.
struct Toolchain {
    sysroot: PathBuf,
    host: String,
    name: String,
}

impl Toolchain {
    fn probe(rustc: &str) -> Result<Toolchain, BuildError> {
        let run =
            |args: &[&str]| -> Result<String, BuildError> {
                let out = Command::new(rustc).args(args).output().map_err(|source| {
                    BuildError::Spawn {
                        what: format!("{rustc} {}", args.join(" ")),
                        source,
                    }
                })?;
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            };
        let sysroot = PathBuf::from(run(&["--print", "sysroot"])?);
        let version = run(&["-vV"])?;
        let host = version
            .lines()
            .find_map(|l| l.strip_prefix("host: "))
            .unwrap_or("x86_64-unknown-linux-gnu")
            .to_string();
        let name = env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| {
            sysroot
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        Ok(Toolchain {
            sysroot,
            host,
            name,
        })
    }

    fn check_components(&self) -> Result<(), BuildError> {
        let bin = self
            .sysroot
            .join("lib/rustlib")
            .join(&self.host)
            .join("bin");
        let checks: [(&'static str, PathBuf); 3] = [
            (
                "rust-src",
                self.sysroot
                    .join("lib/rustlib/src/rust/library/core/Cargo.toml"),
            ),
            ("llvm-tools", bin.join("llc")),
            (
                "llvm-bitcode-linker",
                bin.join("self-contained/llvm-bitcode-linker"),
            ),
        ];
        for (component, path) in checks {
            if !path.exists() {
                return Err(BuildError::MissingComponent {
                    component,
                    looked_for: path,
                    toolchain: self.name.clone(),
                });
            }
        }
        Ok(())
    }
}

/// The library name of a crate: `[lib] name` or the package name with `-`
/// replaced by `_`. Reads only the two keys it needs.
fn crate_lib_name(manifest: &Path) -> Result<String, BuildError> {
    let text = std::fs::read_to_string(manifest).map_err(|source| BuildError::Spawn {
        what: format!("read {}", manifest.display()),
        source,
    })?;
    let mut section = String::new();
    let mut package_name = None;
    let mut lib_name = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if let Some(value) = line.strip_prefix("name").map(str::trim)
            && let Some(value) = value.strip_prefix('=')
        {
            let value = value.trim().trim_matches('"').to_string();
            match section.as_str() {
                "[package]" => package_name = Some(value),
                "[lib]" => lib_name = Some(value),
                _ => {}
            }
        }
    }
    Ok(lib_name
        .or(package_name)
        .unwrap_or_default()
        .replace('-', "_"))
}

/// The dependency paths of a Makefile-style dep-info file (`target: dep
/// dep ...`, one rule per line, spaces in paths escaped as `\ `), each
/// once, in order.
fn dep_info_sources(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        let mut current = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    current.push(' ');
                    chars.next();
                }
                ' ' => {
                    if !current.is_empty() && !out.contains(&current) {
                        out.push(std::mem::take(&mut current));
                    }
                    current.clear();
                }
                _ => current.push(c),
            }
        }
        if !current.is_empty() && !out.contains(&current) {
            out.push(current);
        }
    }
    out
}

/// Prints `cargo:rerun-if-changed` for the crate's manifest and sources
/// (when the build left no dep-info to read).
fn rerun_if_changed_tree(crate_dir: &Path) {
    println!(
        "cargo:rerun-if-changed={}",
        crate_dir.join("Cargo.toml").display()
    );
    println!("cargo:rerun-if-changed={}", crate_dir.join("src").display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_info_lists_every_source_once_with_escaped_spaces() {
        let text = "/t/k.ptx: /a/src/lib.rs /b/gpu-kernel/src/heap.rs /c/my\\ dir/x.rs\n\
                    /t/k.d: /a/src/lib.rs /b/gpu-kernel/src/heap.rs\n\n";
        assert_eq!(
            dep_info_sources(text),
            [
                "/a/src/lib.rs",
                "/b/gpu-kernel/src/heap.rs",
                "/c/my dir/x.rs"
            ]
        );
        assert!(dep_info_sources("").is_empty());
    }

    #[test]
    fn lib_name_prefers_lib_section() {
        let dir = env::temp_dir().join("ptx-builder-test-lib-name");
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = dir.join("Cargo.toml");
        std::fs::write(
            &manifest,
            "[package]\nname = \"my-kernels\"\n\n[lib]\nname = \"kern\"\n",
        )
        .unwrap();
        assert_eq!(crate_lib_name(&manifest).unwrap(), "kern");
        std::fs::write(&manifest, "[package]\nname = \"my-kernels\"\n").unwrap();
        assert_eq!(crate_lib_name(&manifest).unwrap(), "my_kernels");
    }

    #[test]
    fn missing_component_names_the_install_command() {
        let tc = Toolchain {
            sysroot: PathBuf::from("/nonexistent-sysroot"),
            host: "x86_64-unknown-linux-gnu".into(),
            name: "1.95.0".into(),
        };
        let err = tc.check_components().unwrap_err().to_string();
        assert!(err.contains("rust-src"), "{err}");
        assert!(
            err.contains("rustup component add --toolchain 1.95.0 rust-src"),
            "{err}"
        );
    }
}
