//! Compiles `bpf/*.bpf.c` into libbpf-rs skeletons when the `bpf` feature
//! is on. Without it (an analysis-only build) nothing here needs clang.

fn main() {
    #[cfg(feature = "bpf")]
    bpf::build();
}

#[cfg(feature = "bpf")]
mod bpf {
    use std::path::PathBuf;

    pub fn build() {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        for entry in std::fs::read_dir("bpf").expect("bpf/ exists") {
            let path = entry.expect("readable bpf/").path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(stem) = name.strip_suffix(".bpf.c") else {
                continue;
            };
            libbpf_cargo::SkeletonBuilder::new()
                .source(&path)
                .clang_args(["-I", "bpf", "-Wall", "-O2"])
                .build_and_generate(out.join(format!("{stem}.skel.rs")))
                .unwrap_or_else(|e| panic!("building {}: {e:#}", path.display()));
        }
        println!("cargo:rerun-if-changed=bpf");
        agent(&out);
    }

    /// The in-process agent (`agent/`, C: see agent.c for why), which the
    /// memleak binary carries and preloads into commands.
    fn agent(out: &std::path::Path) {
        let so = out.join("libmemleak_agent.so");
        let status =
            std::process::Command::new(std::env::var("CC_AGENT").unwrap_or("clang".into()))
                .args([
                    "-O2",
                    "-g",
                    "-shared",
                    "-fPIC",
                    "-fno-omit-frame-pointer",
                    "-mno-omit-leaf-frame-pointer",
                    // operator new may throw through the agent's frames.
                    "-fexceptions",
                    // glibc's headers declare arguments nonnull that callers
                    // do pass NULL.
                    "-fno-delete-null-pointer-checks",
                    "-fvisibility=hidden",
                    "-Wall",
                    "-Wextra",
                    "-Wno-unused-parameter",
                    "-Wno-pointer-bool-conversion",
                    "-Werror",
                    "-o",
                ])
                .arg(&so)
                .arg("agent/agent.c")
                // libc alone, and libgcc's builtins linked in: no
                // libgcc_s (agent.c says why).
                .args(["-nodefaultlibs", "-lc", "-lgcc"])
                .status()
                .expect("running clang for the agent");
        assert!(status.success(), "building agent/agent.c failed");
        println!("cargo:rerun-if-changed=agent");
    }
}
