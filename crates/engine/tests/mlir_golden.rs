//! The emitted MLIR of every fixture family x precision x target, pinned by hash: a change
//! of the graph code that is meant to keep the graphs (a refactor) must keep every hash; a
//! change meant to change them re-records the file and names each difference in its commit.
//!
//! Emission only (no compile), so the whole matrix takes seconds. Each cell emits the
//! modules the engine would compile for a plan of 4 slots x 64 positions (so the mixed
//! calls of the attention kernel are in) and hashes their text and compile flags, with the
//! two host-dependent strings made neutral: the path of the installed CPU kernel object
//! (its name carries the object's content hash, which depends on the C compiler) and the
//! CUDA kernel's PTX bytes (likewise). CPU cells with the kernels run only where the host
//! has a kernel instruction set; CUDA cells with the kernel only where this build has PTX.
//!
//! `MLX_IREE_BLESS_MLIR=1 cargo test -p engine --test mlir_golden` re-records the file.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod common;

use common::{families, planned};
use engine::{CompileTarget, KernelSetting, KvElem, Precision};

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

const GOLDEN: &str = "tests/mlir_golden.txt";

/// The targets, each with whether the hand-written kernels may link.
fn targets() -> Vec<(&'static str, CompileTarget, KernelSetting)> {
    let cuda = || CompileTarget::Cuda("sm_80".into());
    vec![
        ("cpu", CompileTarget::HostCpu, KernelSetting::Auto),
        ("cpu-graph", CompileTarget::HostCpu, KernelSetting::Off),
        ("cuda", cuda(), KernelSetting::Auto),
        ("cuda-graph", cuda(), KernelSetting::Off),
        ("vulkan", CompileTarget::Vulkan, KernelSetting::Auto),
        ("metal", CompileTarget::Metal, KernelSetting::Auto),
        ("rocm", CompileTarget::Rocm("gfx942".into()), KernelSetting::Auto),
    ]
}

/// Whether a target row can be computed on this host and build as it was recorded.
fn available(name: &str) -> bool {
    match name {
        "cpu" => kernels::cpu::host_isa().is_some(),
        "cuda" => kernels::cuda::ptx().is_some(),
        _ => true,
    }
}

/// (precision, checkpoint variant) pairs: packed reads both quantized checkpoints.
const VARIANTS: [(Precision, &str); 5] = [
    (Precision::F32, "f32"),
    (Precision::F16, "f32"),
    (Precision::BF16, "f32"),
    (Precision::Packed, "q4"),
    (Precision::Packed, "q8"),
];

/// `text` with the value of every `path = "..."` and `data = dense<"0x...">` replaced.
fn neutral(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let next = [("path = \"", '"'), ("data = dense<\"0x", '"')]
            .iter()
            .filter_map(|(open, close)| rest.find(open).map(|i| (i, *open, *close)))
            .min_by_key(|(i, _, _)| *i);
        let Some((i, open, close)) = next else { break };
        out.push_str(&rest[..i + open.len()]);
        out.push_str("<host>");
        let after = &rest[i + open.len()..];
        let end = after.find(close).unwrap();
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn cell(family: &str, precision: Precision, variant: &str, target: &CompileTarget, kernels: KernelSetting) -> String {
    let (_, modules) = planned(family, variant, precision, target, kernels, 4, KvElem::F32);
    let mut hash = Sha256::new();
    for m in modules {
        hash.update(neutral(&m.mlir).as_bytes());
        hash.update(m.options_text().as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn emitted_graphs_match_the_recorded_hashes() {
    let mut now = BTreeMap::new();
    for (name, target, kernels) in targets().into_iter().filter(|(n, _, _)| available(n)) {
        for family in families() {
            for (precision, variant) in VARIANTS {
                let key = format!("{family} {precision}-{variant} {name}");
                now.insert(key, cell(&family, precision, variant, &target, kernels));
            }
        }
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    if std::env::var_os("MLX_IREE_BLESS_MLIR").is_some() {
        let text: String = now.iter().map(|(k, h)| format!("{k} {h}\n")).collect();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let recorded: BTreeMap<String, String> = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (MLX_IREE_BLESS_MLIR=1 records it)", path.display()))
        .lines()
        .filter_map(|l| l.rsplit_once(' ').map(|(k, h)| (k.to_owned(), h.to_owned())))
        .collect();
    let mut differ = Vec::new();
    for (key, hash) in &now {
        match recorded.get(key) {
            Some(h) if h == hash => {}
            Some(_) => differ.push(format!("{key}: emitted graph changed")),
            None => differ.push(format!("{key}: not recorded")),
        }
    }
    // Every recorded row of an available target was emitted again (none dropped).
    for key in recorded.keys() {
        let target = key.rsplit(' ').next().unwrap_or("");
        if available(target) && !now.contains_key(key) {
            differ.push(format!("{key}: recorded, no longer emitted"));
        }
    }
    assert!(differ.is_empty(), "{} of {} cells differ:\n{}", differ.len(), now.len(), differ.join("\n"));
    assert!(now.len() >= 5 * 14 * 5, "only {} cells emitted", now.len());
}

#[test]
fn neutral_text_hides_host_strings_only() {
    let text = r#"a path = "/x/y/qmv-amx-12ab.o" b data = dense<"0x00FF"> : vector<2xi8> c"#;
    assert_eq!(neutral(text), r#"a path = "<host>" b data = dense<"0x<host>"> : vector<2xi8> c"#);
    assert_eq!(neutral("no strings"), "no strings");
}
