//! The typed view of `config.json`'s MLX quantization block.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::{Error, Result};

/// Bit widths this crate unpacks. All are MLX's affine layout: element `j` of a row starts at
/// bit `j * bits` of the row's little-endian bit stream.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];

/// Group sizes this crate accepts.
pub const SUPPORTED_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// How MLX quantized a layer (`mx.quantize`'s `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QuantMode {
    /// `w = q * scale + bias` per group, `q` an unsigned `bits`-bit integer; float scales and
    /// biases.
    #[default]
    Affine,
    /// FP4 (E2M1) values, one E8M0 scale (a power of two, `U8`) per group of 32; no biases.
    Mxfp4,
    /// FP4 (E2M1) values, one FP8 E4M3 scale (`U8`) per group of 16; no biases.
    Nvfp4,
    /// FP8 (E4M3) values, one E8M0 scale per group of 32; no biases.
    Mxfp8,
}

impl QuantMode {
    /// The name config.json gives it.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Nvfp4 => "nvfp4",
            QuantMode::Mxfp8 => "mxfp8",
        }
    }

    /// The bits and group size a floating-point mode fixes (`None` for affine).
    pub fn fixed(self) -> Option<(u32, usize)> {
        match self {
            QuantMode::Affine => None,
            QuantMode::Mxfp4 => Some((4, 32)),
            QuantMode::Nvfp4 => Some((4, 16)),
            QuantMode::Mxfp8 => Some((8, 32)),
        }
    }
}

/// Quantization parameters of one layer: its mode, `group_size` inputs per scale (and, for
/// affine, bias), `bits` per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantParams {
    /// Inputs sharing one scale and bias.
    pub group_size: usize,
    /// Bits per quantized value.
    pub bits: u32,
    pub mode: QuantMode,
}

impl QuantParams {
    /// Affine parameters.
    pub fn affine(group_size: usize, bits: u32) -> QuantParams {
        QuantParams { group_size, bits, mode: QuantMode::Affine }
    }

    /// Checks `bits` against [`SUPPORTED_BITS`] and `group_size` against
    /// [`SUPPORTED_GROUP_SIZES`] (a floating-point mode: against the ones it fixes); the
    /// message says which value is wrong.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some((bits, group_size)) = self.mode.fixed() {
            if (self.bits, self.group_size) != (bits, group_size) {
                return Err(format!(
                    "mode {} takes bits {bits} and group_size {group_size}, not bits {} and group_size {}",
                    self.mode.name(),
                    self.bits,
                    self.group_size
                ));
            }
            return Ok(());
        }
        if !SUPPORTED_BITS.contains(&self.bits) {
            return Err(format!("unsupported bits {} (supported: {SUPPORTED_BITS:?})", self.bits));
        }
        if !SUPPORTED_GROUP_SIZES.contains(&self.group_size) {
            return Err(format!("unsupported group_size {} (supported: {SUPPORTED_GROUP_SIZES:?})", self.group_size));
        }
        Ok(())
    }
}

/// What the config says about one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerQuant {
    /// Quantized with these parameters (the layer's override, else the global ones).
    Quantized(QuantParams),
    /// Left unquantized by an explicit `false` override.
    Unquantized,
}

/// The `quantization` (or `quantization_config`) block of an MLX `config.json`.
///
/// ```json
/// "quantization": {
///     "group_size": 64, "bits": 4, "mode": "affine",
///     "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
///     "model.layers.1.mlp.gate": false
/// }
/// ```
///
/// Keys holding an object or a boolean are per-layer overrides keyed by module path; an
/// override object may omit `group_size` or `bits`, which then come from the global block.
/// Other keys (`quant_method`, ...) are ignored. `mode` is `"affine"` (also when absent),
/// `"mxfp4"`, `"nvfp4"` or `"mxfp8"`; an override without one is affine, as mlx-lm loads it
/// (gpt-oss's mxfp4 checkpoints keep their routers at affine 8 bits so).
///
/// This block does not decide *whether* a layer is quantized: MLX quantizes a layer exactly
/// when its `<prefix>.scales` tensor exists (see [`Checkpoint::linear`](crate::Checkpoint::linear)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantConfig {
    source_key: &'static str,
    global: QuantParams,
    overrides: BTreeMap<String, LayerQuant>,
}

impl QuantConfig {
    /// Reads the quantization block of `config` (the parsed `config.json` at `path`, named in
    /// errors). `quantization` wins over `quantization_config`; `None` when neither is present
    /// (or both are `null`).
    ///
    /// # Errors
    /// [`Error::Config`] naming the key and the bad value: missing or non-integer
    /// `group_size`/`bits`, unsupported values, a `mode` other than `"affine"`, or an override
    /// that is neither an object nor a boolean-like value.
    pub fn from_config(config: &Value, path: &Path) -> Result<Option<QuantConfig>> {
        let Some((key, block)) = ["quantization", "quantization_config"]
            .into_iter()
            .find_map(|k| config.get(k).filter(|v| !v.is_null()).map(|v| (k, v)))
        else {
            return Ok(None);
        };
        let err = |sub: &str, reason: String| Error::Config {
            path: path.to_path_buf(),
            key: if sub.is_empty() { key.to_owned() } else { format!("{key}.{sub}") },
            reason,
        };
        let Value::Object(block) = block else {
            return Err(err("", format!("expected an object, got `{block}`")));
        };
        let mode = read_mode(block, QuantMode::Affine).map_err(|r| err("mode", r))?;
        let group_size = match int_field(block, "group_size").map_err(|r| err("group_size", r))? {
            Some(g) => g,
            None => {
                let method = block
                    .get("quant_method")
                    .map(|m| format!(" (quant_method {m} is not MLX affine quantization)"))
                    .unwrap_or_default();
                return Err(err("group_size", format!("missing{method}")));
            }
        };
        let bits =
            int_field(block, "bits").map_err(|r| err("bits", r))?.ok_or_else(|| err("bits", "missing".to_owned()))?;
        let global = params(group_size, bits, mode).map_err(|(sub, r)| err(sub, r))?;

        let mut overrides = BTreeMap::new();
        for (layer, value) in block {
            let layer_quant = match value {
                Value::Bool(false) => LayerQuant::Unquantized,
                Value::Bool(true) => LayerQuant::Quantized(global),
                Value::Object(o) => {
                    let sub = |field: &str| format!("{layer}.{field}");
                    // mlx-lm hands the override to `to_quantized`, whose mode is affine
                    // unless the override names one.
                    let mode = read_mode(o, QuantMode::Affine).map_err(|r| err(&sub("mode"), r))?;
                    let g = int_field(o, "group_size")
                        .map_err(|r| err(&sub("group_size"), r))?
                        .unwrap_or(global.group_size as u64);
                    let b = int_field(o, "bits").map_err(|r| err(&sub("bits"), r))?.unwrap_or(u64::from(global.bits));
                    LayerQuant::Quantized(params(g, b, mode).map_err(|(f, r)| err(&sub(f), r))?)
                }
                _ => continue,
            };
            overrides.insert(layer.clone(), layer_quant);
        }
        Ok(Some(QuantConfig { source_key: key, global, overrides }))
    }

    /// Which key the block came from: `"quantization"` or `"quantization_config"`.
    pub fn source_key(&self) -> &'static str {
        self.source_key
    }

    /// The global `group_size` and `bits`.
    pub fn global(&self) -> QuantParams {
        self.global
    }

    /// The per-layer overrides, keyed by module path.
    pub fn overrides(&self) -> &BTreeMap<String, LayerQuant> {
        &self.overrides
    }

    /// What applies to layer `prefix` (e.g. `model.layers.0.mlp.down_proj`): its override,
    /// else the global parameters.
    pub fn for_layer(&self, prefix: &str) -> LayerQuant {
        self.overrides.get(prefix).copied().unwrap_or(LayerQuant::Quantized(self.global))
    }
}

/// The block's `mode`, `default` where it has none.
fn read_mode(block: &Map<String, Value>, default: QuantMode) -> std::result::Result<QuantMode, String> {
    const MODES: [QuantMode; 4] = [QuantMode::Affine, QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8];
    match block.get("mode") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(m)) if let Some(mode) = MODES.into_iter().find(|x| x.name() == m) => Ok(mode),
        Some(other) => Err(format!(
            "unsupported quantization mode {other} (supported: \"affine\", \"mxfp4\", \"nvfp4\", \"mxfp8\")"
        )),
    }
}

fn int_field(block: &Map<String, Value>, field: &str) -> std::result::Result<Option<u64>, String> {
    match block.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("expected a non-negative integer, got `{v}`")),
    }
}

/// Builds validated parameters; the error names the offending field.
fn params(group_size: u64, bits: u64, mode: QuantMode) -> std::result::Result<QuantParams, (&'static str, String)> {
    let bits32 = u32::try_from(bits).unwrap_or(u32::MAX);
    if mode != QuantMode::Affine {
        let p = QuantParams { group_size: usize::try_from(group_size).unwrap_or(usize::MAX), bits: bits32, mode };
        return p.validate().map(|()| p).map_err(|r| ("mode", r));
    }
    if !SUPPORTED_BITS.contains(&bits32) {
        return Err(("bits", format!("unsupported bits {bits} (supported: {SUPPORTED_BITS:?})")));
    }
    let gs = usize::try_from(group_size).unwrap_or(usize::MAX);
    if !SUPPORTED_GROUP_SIZES.contains(&gs) {
        return Err((
            "group_size",
            format!("unsupported group_size {group_size} (supported: {SUPPORTED_GROUP_SIZES:?})"),
        ));
    }
    Ok(QuantParams::affine(gs, bits32))
}
