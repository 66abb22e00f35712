//! Device layouts: which globals a precision declares, and the bytes `packed` binds (MLX
//! bits flipped to signed storage, the offset folded into the biases).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use hlo_emit::ElementType;
use models::{
    Activations, Backend, CacheShape, Form, Function, KernelLink, KvElem, Layout, ModelConfig, Precision, Role,
    emit_functions,
};
use std::path::{Path, PathBuf};
use weights::{Checkpoint, Linear};

fn fixture(name: &str, variant: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join(variant)
}

/// A backend that links the CPU kernel object `/k.o` (never read: only its path goes into the module).
fn cpu() -> Backend {
    Backend::with_kernels(KernelLink::Cpu(PathBuf::from("/k.o")))
}

/// A SPIR-V backend.
fn spirv() -> Backend {
    Backend { spirv: true, ..Backend::default() }
}

fn open(name: &str, variant: &str) -> (Checkpoint, ModelConfig) {
    let mut ckpt = Checkpoint::open(fixture(name, variant)).unwrap();
    let cfg = ModelConfig::for_checkpoint(&mut ckpt).unwrap();
    (ckpt, cfg)
}

/// Checks the layout of `precision` on a fixture variant: the (key, dims, elem, role) of
/// the globals whose key contains `filter`.
fn check(
    name: &str,
    variant: &str,
    precision: Precision,
    filter: &str,
    expected: &[(&str, &[usize], ElementType, Role)],
) {
    let (ckpt, cfg) = open(name, variant);
    let layout = Layout::new(&cfg, precision, &ckpt, &Backend::default()).unwrap();
    let got: Vec<_> = layout
        .device_params(&cfg)
        .into_iter()
        .filter(|p| p.key.contains(filter))
        .map(|p| (p.key, p.dims, p.elem, p.role))
        .collect();
    let expected: Vec<_> = expected.iter().map(|(k, d, e, r)| (k.to_string(), d.to_vec(), *e, *r)).collect();
    assert_eq!(got, expected);
}

#[test]
fn dense_precisions_declare_one_matrix_per_weight() {
    let key = "model.layers.0.mlp.up_proj";
    for (precision, elem) in [(Precision::F32, ElementType::F32), (Precision::F16, ElementType::F16)] {
        check("qwen2", "q4", precision, key, &[("model.layers.0.mlp.up_proj.weight", &[128, 64], elem, Role::Dense)]);
    }
}

#[test]
fn packed_keeps_weight_scales_and_biases() {
    // qwen2's fixtures: hidden 64, intermediate 128, group size 64; q4 has bf16 scales (so
    // the adjusted biases are f32), q8 f16 scales (biases f16 too).
    check(
        "qwen2",
        "q4",
        Precision::Packed,
        "model.layers.0.mlp.up_proj",
        &[
            ("model.layers.0.mlp.up_proj.weight", &[128, 64], ElementType::I4, Role::PackedWeight),
            ("model.layers.0.mlp.up_proj.scales", &[128, 1], ElementType::BF16, Role::PackedScales),
            ("model.layers.0.mlp.up_proj.biases", &[128, 1], ElementType::F32, Role::PackedBiases),
        ],
    );
    check(
        "qwen2",
        "q8",
        Precision::Packed,
        "model.embed_tokens",
        &[
            ("model.embed_tokens.weight", &[384, 64], ElementType::I8, Role::PackedWeight),
            ("model.embed_tokens.scales", &[384, 1], ElementType::F16, Role::PackedScales),
            ("model.embed_tokens.biases", &[384, 1], ElementType::F16, Role::PackedBiases),
        ],
    );
}

/// The packed bytes dequantize to exactly what MLX computes: `s * q + b` with MLX's unsigned
/// `q` equals `s * signed(q ^ 2^(bits-1)) + (b + 2^(bits-1) s)`, for every element, values
/// of 8 and above included (IREE 3.13 reads `ui4` as signed; docs/ARCHITECTURE.md, "Toolchain facts").
#[test]
fn packed_bytes_dequantize_like_mlx() {
    // qwen3's gate_proj has 176 rows: 4-bit stored one value per byte (`wide`, any
    // dimension not a multiple of 64).
    for (name, variant, bits, prefix) in [
        ("llama_linear_untied", "q4", 4u32, "model.layers.1.self_attn.o_proj"),
        ("llama_linear_untied", "q8", 8, "model.layers.1.self_attn.o_proj"),
        ("qwen3", "q4", 4, "model.layers.0.mlp.gate_proj"),
    ] {
        let (ckpt, cfg) = open(name, variant);
        let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap();
        let params = layout.device_params(&cfg);
        let find = |suffix: &str| params.iter().find(|p| p.key == format!("{prefix}.{suffix}")).unwrap().clone();
        let (w, s, b) = (find("weight"), find("scales"), find("biases"));
        let wbytes = layout.load(&ckpt, &w).unwrap();
        assert_eq!(wbytes.len(), w.bytes());
        let s_vals = floats(s.elem, &layout.load(&ckpt, &s).unwrap());
        let b_vals = floats(b.elem, &layout.load(&ckpt, &b).unwrap());
        let signed: Vec<i32> = if w.elem == ElementType::I4 {
            wbytes.iter().flat_map(|&v| [((v << 4) as i8 >> 4) as i32, (v as i8 >> 4) as i32]).collect()
        } else {
            wbytes.iter().map(|&v| v as i8 as i32).collect()
        };
        let Linear::Quantized(q) = ckpt.linear(prefix).unwrap() else { panic!("{prefix} is quantized") };
        let mlx = q.dequantize_f32();
        let (cols, gs) = (w.dims[1], q.group_size());
        let mut high = 0;
        for (i, (&value, &want)) in signed.iter().zip(&mlx).enumerate() {
            let g = (i / cols) * (cols / gs) + (i % cols) / gs;
            let got = s_vals[g] * value as f32 + b_vals[g];
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{variant} element {i}: {got} vs {want}");
            high += usize::from(value >= 0); // MLX's q = value + 2^(bits-1) >= 2^(bits-1)
        }
        let wide = w.dims.iter().any(|d| d % 64 != 0);
        assert_eq!(w.elem, if bits == 4 && !wide { ElementType::I4 } else { ElementType::I8 }, "{name} {variant}");
        assert_eq!(signed.len(), mlx.len());
        assert!(high > mlx.len() / 4, "{variant}: the fixture exercises values >= 2^(bits-1)");
    }
}

fn floats(elem: ElementType, bytes: &[u8]) -> Vec<f32> {
    match elem {
        ElementType::F32 => bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        ElementType::BF16 => bytes.chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        ElementType::F16 => bytes.chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => panic!("not a float: {other}"),
    }
}

#[test]
fn packed_needs_a_quantized_checkpoint() {
    let (ckpt, cfg) = open("qwen2", "f32");
    let err = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap_err().to_string();
    let dir = fixture("qwen2", "f32");
    assert_eq!(
        err,
        format!(
            "precision `packed` needs an MLX-quantized checkpoint; {} has dense weights (use f16, or quantize it with mlx_lm.convert -q)",
            dir.display()
        )
    );
}

/// With the CPU kernels, packed matrices take the kernel's 16-row block layout; scales and
/// biases stay f16 beside f16 checkpoints and become f32 otherwise (biases as MLX's).
#[test]
fn cpu_kernel_layout() {
    for (variant, bits, scale) in [("q4", 4, ElementType::F32), ("q8", 8, ElementType::F16)] {
        let (ckpt, cfg) = open("qwen2", variant);
        let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
        assert_eq!(layout.kernel_object(), Some(Path::new("/k.o")));
        let params: Vec<_> = layout
            .device_params(&cfg)
            .into_iter()
            .filter(|p| p.key.starts_with("model.layers.0.mlp."))
            .map(|p| (p.key, p.dims, p.elem))
            .collect();
        // gate_proj and up_proj [128, 64] read the same input: stacked into one [256, 64]
        // matrix, group size 64: 16 blocks of 16 rows, 64 * bits * 16 / 8 bytes each.
        let key = |s: &str| format!("model.layers.0.mlp.{s}");
        assert_eq!(
            params[..3],
            [
                (key("gate_up_proj.weight"), vec![16, 64 * bits * 16 / 8], ElementType::I8),
                (key("gate_up_proj.scales"), vec![16, 16], scale),
                (key("gate_up_proj.biases"), vec![16, 16], scale)
            ],
            "{variant}"
        );
        assert_eq!(layout.merged("model.layers.0.mlp.up_proj"), Some(("model.layers.0.mlp.gate_up_proj", 128, 128)));
        assert_eq!(
            layout.merged("model.layers.0.self_attn.k_proj").map(|m| m.0),
            Some("model.layers.0.self_attn.qkv_proj")
        );
        let w = layout.device_params(&cfg).into_iter().find(|p| p.key == key("gate_up_proj.weight")).unwrap();
        assert_eq!(layout.load(&ckpt, &w).unwrap().len(), w.bytes());
    }
}

/// mxfp4 and nvfp4 in the CPU kernel's form: the E2M1 codes as stored, 4 bits a value in the
/// kernel's blocks, no biases (the kernel computes them), dispatched to the FP4 exports;
/// mxfp4's scales are its E8M0 bytes as stored, nvfp4's f16 `s / 2`. The graph form holds the
/// exact 8-bit copy instead, with its biases.
#[test]
fn fp4_codes_stay_four_bits_in_the_kernel() {
    for (variant, gs, suffix, elem) in [("mxfp4", 32, "e8m0", ElementType::I8), ("nvfp4", 16, "f16", ElementType::F16)]
    {
        let (ckpt, cfg) = open("llama_llama3_tied", variant);
        let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
        let prefix = "model.layers.0.mlp.down_proj";
        assert!(
            matches!(layout.form(prefix), Some(Form::CpuPacked(p)) if p.bits == 4 && p.fp4 && !p.has_biases()),
            "{variant}: {:?}",
            layout.form(prefix)
        );
        let params: Vec<_> = layout.device_params(&cfg).into_iter().filter(|p| p.key.starts_with(prefix)).collect();
        // down_proj [64, 128]: 4 blocks of 16 rows, 128 * 4 * 16 / 8 bytes each.
        let got: Vec<_> = params.iter().map(|p| (p.key.as_str(), p.dims.clone(), p.elem)).collect();
        let key = |s: &str| format!("{prefix}.{s}");
        assert_eq!(
            got,
            [
                (key("weight").as_str(), vec![4, 1024], ElementType::I8),
                (key("scales").as_str(), vec![4, 128 / gs * 16], elem)
            ],
            "{variant}"
        );
        let Linear::Quantized(q) = ckpt.linear(prefix).unwrap() else { panic!("quantized") };
        let bytes = layout.load(&ckpt, &params[0]).unwrap();
        assert_eq!(bytes[..], kernels::cpu::repack_weight(4, 64, 128, q.weight().bytes())[..], "{variant}: codes");
        let scales = layout.load(&ckpt, &params[1]).unwrap();
        if elem == ElementType::I8 {
            let stored = kernels::cpu::repack_groups(q.scales().bytes(), 64, 128 / gs);
            assert_eq!(scales[..], stored[..], "{variant}: the E8M0 bytes as stored");
            let halves: Vec<f32> = stored.iter().map(|&e| kernels::cpu::Scale::e8m0_half(e)).collect();
            let copy = q.to_affine().unwrap();
            assert_eq!(halves, kernels::cpu::repack_groups(&copy.scales, 64, 128 / gs), "{variant}: read as s / 2");
        } else {
            let copy = q.to_affine().unwrap();
            assert_eq!(floats(elem, &scales), kernels::cpu::repack_groups(&copy.scales, 64, 128 / gs), "{variant}");
        }
        let cache = CacheShape { slots: 1, positions: 64, elem: KvElem::F32, scratch: false };
        let functions = [Function::Decode { rows: 1, window: 32 }];
        let text = emit_functions(&cfg, &layout, cache, &functions, None).unwrap();
        let (export, rows) = (format!("@qmvfp4_{suffix}"), format!("@qrowsfp4_{suffix}"));
        assert!(text.contains(&export) && text.contains(&rows), "{variant}");
        // The graph form: the 8-bit copy, with biases.
        let graph = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap();
        assert!(matches!(graph.form(prefix), Some(Form::GraphPacked(p)) if p.bits == 8 && p.has_biases()));
    }
}

/// mxfp8 in the CPU kernel's form: its codes and E8M0 scale bytes as stored, one byte each,
/// in the dense product's 16-row blocks, q/k/v and gate/up stacked, dispatched to the mxfp8
/// exports (the embedding table's rows too, which the tied head reads); the graph form holds
/// the stored bytes in their own order. Either way the device holds the file's bytes.
#[test]
fn mxfp8_stays_one_byte_a_weight() {
    let (ckpt, cfg) = open("llama_llama3_tied", "mxfp8");
    let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
    let prefix = "model.layers.0.mlp.down_proj";
    assert_eq!(layout.form(prefix), Some(Form::CpuMxfp8));
    assert_eq!(layout.form("model.embed_tokens"), Some(Form::CpuMxfp8));
    assert_eq!(layout.merged("model.layers.0.mlp.up_proj"), Some(("model.layers.0.mlp.gate_up_proj", 128, 128)));
    let params: Vec<_> = layout.device_params(&cfg).into_iter().filter(|p| p.key.starts_with(prefix)).collect();
    let got: Vec<_> = params.iter().map(|p| (p.key.as_str(), p.dims.clone(), p.elem)).collect();
    let key = |s: &str| format!("{prefix}.{s}");
    // down_proj [64, 128]: 4 blocks of 16 rows, 128 codes and 4 scales a row.
    assert_eq!(
        got,
        [
            (key("weight").as_str(), vec![4, 128 * 16], ElementType::I8),
            (key("scales").as_str(), vec![4, 4 * 16], ElementType::I8)
        ]
    );
    let Linear::Quantized(q) = ckpt.linear(prefix).unwrap() else { panic!("quantized") };
    assert_eq!(
        layout.load(&ckpt, &params[0]).unwrap()[..],
        kernels::cpu::repack_dense(q.weight().bytes(), 64, 128)[..]
    );
    assert_eq!(layout.load(&ckpt, &params[1]).unwrap()[..], kernels::cpu::repack_dense(q.scales().bytes(), 64, 4)[..]);
    // Every matrix's bytes are the file's (the norms aside, f32 as stored).
    let all = layout.device_params(&cfg);
    let stacked = all.iter().find(|p| p.key == "model.layers.0.mlp.gate_up_proj.weight").unwrap();
    assert_eq!(layout.load(&ckpt, stacked).unwrap().len(), 256 * 64);
    let cache = CacheShape { slots: 1, positions: 64, elem: KvElem::F32, scratch: false };
    let functions = [Function::Decode { rows: 1, window: 32 }];
    let text = emit_functions(&cfg, &layout, cache, &functions, None).unwrap();
    for export in ["@hmv_mxfp8", "@hmvr_mxfp8", "@hrows_mxfp8"] {
        assert!(text.contains(export), "{export}");
    }
    let graph = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap();
    assert_eq!(graph.form(prefix), Some(Form::GraphMxfp8));
    assert!(graph.has_graph_packing() && graph.kernel_object().is_none());
    let params: Vec<_> = graph.device_params(&cfg).into_iter().filter(|p| p.key.starts_with(prefix)).collect();
    assert_eq!(params.iter().map(|p| p.dims.clone()).collect::<Vec<_>>(), [vec![64, 128], vec![64, 4]]);
    assert_eq!(graph.load(&ckpt, &params[0]).unwrap()[..], q.weight().bytes()[..]);
    let text = emit_functions(&cfg, &graph, cache, &functions, None).unwrap();
    assert!(!text.contains("mxfp8"), "the graph form dispatches no kernel");
    // Stacked experts stay as stored in the graph form, beside the kernel's other matrices.
    let (ckpt, cfg) = open("qwen3_moe", "mxfp8");
    let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
    let experts = "model.layers.0.mlp.switch_mlp.gate_proj";
    assert_eq!(layout.form(experts), Some(Form::GraphMxfp8));
    assert_eq!(layout.form("model.layers.0.self_attn.o_proj"), Some(Form::CpuMxfp8));
    let params: Vec<_> = layout.device_params(&cfg).into_iter().filter(|p| p.key.starts_with(experts)).collect();
    assert_eq!(params.iter().map(|p| p.dims.clone()).collect::<Vec<_>>(), [vec![8, 64, 64], vec![8, 64, 2]]);
    let stored = ckpt.tensor(&format!("{experts}.weight")).unwrap();
    assert_eq!(layout.load(&ckpt, &params[0]).unwrap()[..], stored.bytes()[..]);
}

/// Affine 3-bit and 6-bit weights in the CPU kernel's form: MLX's values as stored (3/4 of
/// the 4-bit and 8-bit tiles' bytes), MLX's scales and biases, dispatched to the `qmv3`/`qmv6`
/// exports; 2 and 5 bits are held as the exact 4-bit and 8-bit copies; the graph form holds
/// the 4-bit and 8-bit copies.
#[test]
fn three_and_six_bits_stay_as_stored_in_the_kernel() {
    for (variant, stored, held, export) in
        [("q3", 3, 3, "@qmv3_"), ("q6", 6, 6, "@qmv6_"), ("q2", 2, 4, "@qmv4_"), ("q5", 5, 8, "@qmv8_")]
    {
        let (ckpt, cfg) = open("llama_llama3_tied", variant);
        let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
        let prefix = "model.layers.0.mlp.down_proj";
        assert!(
            matches!(layout.form(prefix), Some(Form::CpuPacked(p)) if p.bits == held && p.stored == stored),
            "{variant}: {:?}",
            layout.form(prefix)
        );
        let params: Vec<_> = layout.device_params(&cfg).into_iter().filter(|p| p.key.starts_with(prefix)).collect();
        // down_proj [64, 128]: 4 blocks of 16 rows, 128 * bits * 16 / 8 bytes each.
        assert_eq!(params[0].dims, vec![4, 128 * held as usize * 2], "{variant}");
        let Linear::Quantized(q) = ckpt.linear(prefix).unwrap() else { panic!("quantized") };
        if held == stored {
            let bytes = layout.load(&ckpt, &params[0]).unwrap();
            assert_eq!(bytes.len(), q.weight().bytes().len(), "{variant}: the checkpoint's bytes");
            assert_eq!(bytes[..], kernels::cpu::repack_weight(stored, 64, 128, q.weight().bytes())[..], "{variant}");
        }
        let cache = CacheShape { slots: 1, positions: 64, elem: KvElem::F32, scratch: false };
        let functions = [Function::Decode { rows: 1, window: 32 }];
        let text = emit_functions(&cfg, &layout, cache, &functions, None).unwrap();
        assert!(text.contains(export), "{variant}: {export}");
        let graph = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap();
        let copy = if stored <= 4 { 4 } else { 8 };
        assert!(matches!(graph.form(prefix), Some(Form::GraphPacked(p)) if p.bits == copy), "{variant}");
    }
}

/// With the CPU kernels, an f16 (or bf16) layout holds every dense matrix of whole 16-row blocks,
/// the embedding table included, in the f16 product's blocks (`kernels::cpu::repack_dense`),
/// and the graph dispatches the f16 exports for them; routers and stacked experts stay as
/// they were.
#[test]
fn f16_matrices_in_the_kernel_blocks() {
    let (ckpt, cfg) = open("qwen2", "f32");
    let layout = Layout::new(&cfg, Precision::F16, &ckpt, &cpu()).unwrap();
    assert_eq!(layout.kernel_object(), Some(Path::new("/k.o")));
    let param = |key: &str| layout.device_params(&cfg).into_iter().find(|p| p.key == key).unwrap();
    // gate and up [128, 64] read the same input: stacked into [256, 64], 16 blocks of 64
    // columns x 16 rows; the tied table [384, 64] the same way.
    let gate_up = param("model.layers.0.mlp.gate_up_proj.weight");
    assert_eq!(
        (gate_up.dims.clone(), gate_up.elem, gate_up.role),
        (vec![16, 1024], ElementType::F16, Role::DenseBlocks)
    );
    assert_eq!(layout.merged("model.layers.0.mlp.up_proj"), Some(("model.layers.0.mlp.gate_up_proj", 128, 128)));
    assert_eq!(
        layout.merged("model.layers.0.self_attn.v_proj").map(|m| m.0),
        Some("model.layers.0.self_attn.qkv_proj")
    );
    let table = param("model.embed_tokens.weight");
    assert_eq!((table.dims.clone(), table.role), (vec![24, 1024], Role::DenseBlocks));
    // The bytes: each part's values rounded to f16, then blocked, gate's blocks first.
    let blocked = |spec: &models::ParamSpec| -> Vec<u8> {
        let bits: Vec<u16> =
            models::load_f32(&ckpt, spec).unwrap().into_iter().map(|v| half::f16::from_f32(v).to_bits()).collect();
        kernels::cpu::repack_dense(&bits, spec.shape[0], spec.shape[1]).iter().flat_map(|b| b.to_le_bytes()).collect()
    };
    let want = [blocked(&gate_up.parts[0]), blocked(&gate_up.parts[1])].concat();
    assert_eq!(gate_up.parts[1].key, "model.layers.0.mlp.up_proj.weight");
    assert_eq!(layout.load(&ckpt, &gate_up).unwrap()[..], want[..]);
    assert!((layout.form("model.layers.1.self_attn.o_proj") == Some(Form::CpuDense)));
    // Without the kernels, or at another precision, the same matrix stays row-major.
    let plain = Layout::new(&cfg, Precision::F16, &ckpt, &Backend::default()).unwrap();
    assert!(
        !(plain.form("model.layers.0.mlp.up_proj") == Some(Form::CpuDense))
            && plain.merged("model.layers.0.mlp.up_proj").is_none()
    );
    let f32 = Layout::new(&cfg, Precision::F32, &ckpt, &cpu()).unwrap();
    assert!(!(f32.form("model.layers.0.mlp.up_proj") == Some(Form::CpuDense)) && f32.kernel_object().is_none());
    // bf16 the same way, in its own element type and exports.
    let bf16 = Layout::new(&cfg, Precision::BF16, &ckpt, &cpu()).unwrap();
    let p = bf16.device_params(&cfg).into_iter().find(|p| p.key == "model.layers.0.self_attn.o_proj.weight").unwrap();
    assert_eq!((p.dims.clone(), p.elem, p.role), (vec![4, 1024], ElementType::BF16, Role::DenseBlocks));
    let bits: Vec<u16> =
        models::load_f32(&ckpt, &p.spec).unwrap().into_iter().map(|v| half::bf16::from_f32(v).to_bits()).collect();
    let want: Vec<u8> = kernels::cpu::repack_dense(&bits, 64, 64).iter().flat_map(|b| b.to_le_bytes()).collect();
    assert_eq!(bf16.load(&ckpt, &p).unwrap()[..], want[..]);
    let cache = CacheShape { slots: 1, positions: 32, elem: KvElem::F32, scratch: false };
    let mlir = emit_functions(&cfg, &bf16, cache, &[Function::Decode { rows: 1, window: 32 }], None).unwrap();
    assert!(mlir.contains("export public @hmvr_bf16 ") && !mlir.contains("@hmv_f16"));
    // The graph: one f16 product per matrix, residual adds in the output and down projections, the lookup.
    let mlir = emit_functions(&cfg, &layout, cache, &[Function::Decode { rows: 1, window: 32 }], None).unwrap();
    for export in ["@hmv_f16", "@hmvr_f16", "@hrows_f16"] {
        assert!(mlir.contains(&format!("hal.executable.export public {export} ")), "{export}");
    }
    // Stacked experts and routers are not blocked.
    let (ckpt, cfg) = open("qwen3_moe", "f32");
    let moe = Layout::new(&cfg, Precision::F16, &ckpt, &cpu()).unwrap();
    let roles: Vec<(String, Role)> = moe
        .device_params(&cfg)
        .into_iter()
        .filter(|p| p.key.starts_with("model.layers.0.mlp."))
        .map(|p| (p.key, p.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("model.layers.0.mlp.gate.weight".to_owned(), Role::Widened),
            ("model.layers.0.mlp.switch_mlp.gate_proj.weight".to_owned(), Role::Dense),
            ("model.layers.0.mlp.switch_mlp.up_proj.weight".to_owned(), Role::Dense),
            ("model.layers.0.mlp.switch_mlp.down_proj.weight".to_owned(), Role::Dense),
        ]
    );
}

/// Stacked experts take the kernel's blocks expert by expert, and the graph dispatches the
/// kernel's `qmve` for them; without the kernel they stay as MLX stores them.
#[test]
fn stacked_experts_in_the_kernel_layout() {
    let (ckpt, cfg) = open("qwen3_moe", "q4");
    const DOWN: &str = "model.layers.0.mlp.switch_mlp.down_proj";
    let params = |layout: &Layout| -> Vec<(String, Vec<usize>, ElementType)> {
        let of_down = layout.device_params(&cfg).into_iter().filter(|p| p.key.starts_with(DOWN));
        of_down.map(|p| (p.key, p.dims, p.elem)).collect()
    };
    let key = |s: &str| format!("{DOWN}.{s}");
    // As stored: 8 experts x [64, 64] at 4 bits (32 bytes a row), bf16 scales and biases.
    let stored = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap();
    assert_eq!(
        params(&stored),
        [
            (key("weight"), vec![8, 64, 32], ElementType::I8),
            (key("scales"), vec![8, 64, 1], ElementType::BF16),
            (key("biases"), vec![8, 64, 1], ElementType::BF16)
        ]
    );
    // The kernel's: 4 blocks of 16 rows per expert, 64 * 4 * 16 / 8 bytes each, f32 groups.
    let kernel = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
    assert_eq!(
        params(&kernel),
        [
            (key("weight"), vec![8, 4, 512], ElementType::I8),
            (key("scales"), vec![8, 4, 16], ElementType::F32),
            (key("biases"), vec![8, 4, 16], ElementType::F32)
        ]
    );
    let w = kernel.device_params(&cfg).into_iter().find(|p| p.key == key("weight")).unwrap();
    let bytes = kernel.load(&ckpt, &w).unwrap();
    let Linear::Quantized(q) = ckpt.expert(DOWN, 5).unwrap() else { panic!("quantized experts") };
    assert_eq!(bytes[5 * 2048..6 * 2048], kernels::cpu::repack_weight(4, 64, 64, q.weight().bytes())[..]);
    // The graph: the kernel's export for each layout that has it, the gather of experts
    // in the graph form otherwise.
    let emit = |layout: &Layout| {
        let cache = CacheShape { slots: 1, positions: 64, elem: KvElem::F32, scratch: false };
        let functions = [Function::Decode { rows: 1, window: 32 }, Function::Prefill { tokens: 16, window: 32 }];
        emit_functions(&cfg, layout, cache, &functions, None).unwrap()
    };
    let with_kernel = emit(&kernel);
    assert!(with_kernel.contains("@qmve4_f32"), "the decode and prefill functions dispatch qmve");
    let graph_form = emit(&stored);
    assert!(!graph_form.contains("qmve") && graph_form.contains("slice_sizes = array<i64: 1, 64, 32>"));
}

/// A router stays f32 on the device at every dense precision, its values rounded to that
/// precision (`Role::Widened`): what the graph computes is f16's or bf16's model.
#[test]
fn routers_are_rounded_then_widened() {
    let (ckpt, cfg) = open("qwen2_moe", "f32");
    for (precision, round) in [
        (Precision::F16, (|x: f32| half::f16::from_f32(x).to_f32()) as fn(f32) -> f32),
        (Precision::BF16, |x: f32| half::bf16::from_f32(x).to_f32()),
        (Precision::F32, |x: f32| x),
    ] {
        let layout = Layout::new(&cfg, precision, &ckpt, &Backend::default()).unwrap();
        let params = layout.device_params(&cfg);
        for key in ["model.layers.1.mlp.gate.weight", "model.layers.1.mlp.shared_expert_gate.weight"] {
            let p = params.iter().find(|p| p.key == key).unwrap();
            assert_eq!((p.elem, p.role), (ElementType::F32, Role::Widened), "{key} at {precision}");
            let got: Vec<f32> = layout
                .load(&ckpt, p)
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let stored = ckpt.tensor(key).unwrap().to_f32_vec().unwrap();
            let want: Vec<f32> = stored.iter().map(|x| round(*x)).collect();
            assert_eq!(got, want, "{key} at {precision}");
            if precision != Precision::F32 {
                assert_ne!(got, stored, "{key} at {precision}: rounding shows in random weights");
            }
        }
    }
}

/// SPIR-V's form: bf16 matrices as their 16-bit patterns (the same bytes as bf16), 4-bit
/// weights a byte a value (`q - 8`, the bytes of `wide`), bf16 scales as f32.
#[test]
fn spirv_layout_holds_bf16_as_bits_and_four_bits_as_bytes() {
    let (ckpt, cfg) = open("qwen2", "q4");
    let key = "model.layers.0.mlp.up_proj";
    let params = |layout: &Layout| -> Vec<_> {
        layout.device_params(&cfg).into_iter().filter(|p| p.key.contains(key)).collect::<Vec<_>>()
    };
    let bf16 = Layout::new(&cfg, Precision::BF16, &ckpt, &Backend::default()).unwrap();
    let bits = Layout::new(&cfg, Precision::BF16, &ckpt, &spirv()).unwrap();
    let (plain, as_bits) = (params(&bf16), params(&bits));
    assert_eq!((as_bits[0].elem, as_bits[0].role), (ElementType::I16, Role::Dense));
    assert_eq!(bits.load(&ckpt, &as_bits[0]).unwrap(), bf16.load(&ckpt, &plain[0]).unwrap());

    let packed = Layout::new(&cfg, Precision::Packed, &ckpt, &spirv()).unwrap();
    let got: Vec<_> = params(&packed).into_iter().map(|p| (p.key, p.dims, p.elem, p.role)).collect();
    let want = [
        ("model.layers.0.mlp.up_proj.weight", vec![128, 64], ElementType::I8, Role::PackedWeight),
        ("model.layers.0.mlp.up_proj.scales", vec![128, 1], ElementType::F32, Role::PackedScales),
        ("model.layers.0.mlp.up_proj.biases", vec![128, 1], ElementType::F32, Role::PackedBiases),
    ];
    let want: Vec<_> = want.into_iter().map(|(k, d, e, r)| (k.to_owned(), d, e, r)).collect();
    assert_eq!(got, want);
    // The scales' values, widened exactly from the checkpoint's bf16.
    let scales = params(&packed).into_iter().find(|p| p.role == Role::PackedScales).unwrap();
    let bytes = packed.load(&ckpt, &scales).unwrap();
    let Linear::Quantized(q) = ckpt.linear(key).unwrap() else { panic!("{key} is not quantized") };
    let want: Vec<u8> = q.scales().to_f32_vec().unwrap().iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(bytes.as_ref(), want.as_slice());
}

/// With the CUDA kernel, q, k and v (packed alike) are stacked by rows in the graph form
/// into one matrix the kernel reads in one dispatch; the stacked bytes are the parts'
/// bytes, in order. Gate and up stay apart (the kernel's `glu` reads both).
#[test]
fn cuda_kernel_layout_stacks_q_k_v() {
    let (ckpt, cfg) = open("llama_llama3_tied", "q8");
    let plain = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::default()).unwrap();
    let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &Backend::with_kernels(KernelLink::Cuda)).unwrap();
    if kernels::cuda::ptx().is_none() {
        assert!(!layout.has_graph_packing() && layout.merged("model.layers.0.self_attn.k_proj").is_none());
        return;
    }
    let attn = |s: &str| format!("model.layers.0.self_attn.{s}");
    // q [64, 64], k and v [32, 64]: 128 rows, groups of 64, 8 bits, f16 scales as stored.
    assert_eq!(layout.merged(&attn("q_proj")), Some((attn("qkv_proj").as_str(), 0, 64)));
    assert_eq!(layout.merged(&attn("k_proj")), Some((attn("qkv_proj").as_str(), 64, 32)));
    assert_eq!(layout.merged(&attn("v_proj")), Some((attn("qkv_proj").as_str(), 96, 32)));
    assert_eq!(layout.merged("model.layers.0.mlp.up_proj"), None);
    let params = layout.device_params(&cfg);
    let merged: Vec<_> = params.iter().filter(|p| p.key.starts_with(&attn("qkv_proj"))).collect();
    let shapes: Vec<_> = merged.iter().map(|p| (p.key.as_str(), p.dims.clone(), p.elem)).collect();
    assert_eq!(
        shapes,
        [
            (attn("qkv_proj.weight").as_str(), vec![128, 64], ElementType::I8),
            (attn("qkv_proj.scales").as_str(), vec![128, 1], ElementType::F16),
            (attn("qkv_proj.biases").as_str(), vec![128, 1], ElementType::F16)
        ]
    );
    assert!(!params.iter().any(|p| p.key.starts_with(&attn("q_proj."))), "q_proj declared beside qkv_proj");
    let plain_params = plain.device_params(&cfg);
    for m in merged {
        let name = m.key.rsplit('.').next().unwrap();
        let mut parts = Vec::new();
        for part in ["q_proj", "k_proj", "v_proj"] {
            let p = plain_params.iter().find(|p| p.key == attn(&format!("{part}.{name}"))).unwrap();
            parts.extend_from_slice(&plain.load(&ckpt, p).unwrap());
        }
        let bytes = layout.load(&ckpt, m).unwrap();
        assert_eq!(bytes.len(), m.bytes(), "{}", m.key);
        assert!(bytes[..] == parts[..], "{}: not the parts' bytes in order", m.key);
    }
}

/// Latent attention's per-head matrices (`Kind::Heads`) stay dense f32 at every precision:
/// a 4-bit checkpoint's dequantized exactly as MLX computes them (`scale * q + bias`); its
/// experts (deepseek_v3's, glm4_moe's) go to the CPU kernel's blocks like qwen3_moe's, and
/// the router's correction bias is an f32 vector.
#[test]
fn per_head_matrices_dense_and_grouped_experts_in_the_kernel() {
    let (ckpt, cfg) = open("deepseek_v3", "q4");
    let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
    let params = layout.device_params(&cfg);
    let find = |key: &str| params.iter().find(|p| p.key == key).unwrap_or_else(|| panic!("no {key}"));
    let embed_q = find("model.layers.1.self_attn.embed_q.weight");
    assert_eq!(
        (embed_q.dims.as_slice(), embed_q.elem, embed_q.role),
        (&[4, 32, 32][..], ElementType::F32, Role::Widened)
    );
    let got: Vec<f32> = layout
        .load(&ckpt, embed_q)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let head = |h: usize| {
        let Linear::Quantized(q) = ckpt.expert("model.layers.1.self_attn.embed_q", h).unwrap() else {
            panic!("a 4-bit embed_q")
        };
        Linear::Quantized(q).weight_f32()
    };
    assert_eq!(got[3 * 32 * 32..], head(3)[..]);
    assert_eq!(layout.form("model.layers.1.self_attn.embed_q"), Some(Form::Narrow));
    assert!(matches!(layout.form("model.layers.1.mlp.switch_mlp.gate_proj"), Some(Form::CpuPacked(_))));
    let bias = find("model.layers.1.mlp.gate.e_score_correction_bias");
    assert_eq!((bias.dims.as_slice(), bias.elem, bias.role), (&[8][..], ElementType::F32, Role::Vector));
    let (ckpt, cfg) = open("glm4_moe", "q4");
    let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &cpu()).unwrap();
    for part in ["gate_proj", "up_proj", "down_proj"] {
        let prefix = format!("model.layers.2.mlp.switch_mlp.{part}");
        assert!(matches!(layout.form(&prefix), Some(Form::CpuPacked(_))), "{prefix}");
    }
    assert_eq!(layout.form("model.layers.2.mlp.gate"), Some(Form::Narrow), "mlx-lm leaves the router dense");
}

/// `Activations::I8`: every packed product in the kernel dispatches its `_x8` twin (the
/// residual ones too), while the embedding's row lookup reads no x and the experts' `qmve`
/// keeps i16; the default emits no `_x8` export at all.
#[test]
fn eight_bit_activations_take_the_x8_products() {
    let (ckpt, cfg) = open("qwen3_moe", "q4");
    let emit = |activations| {
        let mut backend = cpu();
        backend.emit.activations = activations;
        let layout = Layout::new(&cfg, Precision::Packed, &ckpt, &backend).unwrap();
        let cache = CacheShape { slots: 1, positions: 64, elem: KvElem::F32, scratch: false };
        let functions = [Function::Decode { rows: 1, window: 32 }, Function::Prefill { tokens: 16, window: 32 }];
        emit_functions(&cfg, &layout, cache, &functions, None).unwrap()
    };
    let exports = |mlir: &str| -> std::collections::BTreeSet<String> {
        mlir.split("hal.executable.export public @").skip(1).map(|s| s.split(' ').next().unwrap().to_owned()).collect()
    };
    let i16 = exports(&emit(Activations::I16));
    let i8 = exports(&emit(Activations::I8));
    assert!(i16.iter().all(|e| !e.ends_with("_x8")), "{i16:?}");
    let products: Vec<&String> = i16.iter().filter(|e| e.starts_with("qmv4") || e.starts_with("qmvr4")).collect();
    assert!(!products.is_empty(), "{i16:?}");
    for e in products {
        assert!(i8.contains(&format!("{e}_x8")) && !i8.contains(e), "{e}: {i8:?}");
    }
    for e in i16.iter().filter(|e| e.starts_with("qrows") || e.starts_with("qmve")) {
        assert!(i8.contains(e), "{e} is the same with 8-bit activations: {i8:?}");
    }
}
