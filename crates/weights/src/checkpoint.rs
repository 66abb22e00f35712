//! A checkpoint folder: `config.json` plus one or more memory-mapped safetensors shards.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::config::{LayerQuant, QuantConfig};
use crate::quant::{DenseLinear, Linear, QuantizedLinear};
use crate::{Error, Result, SafetensorsFile, TensorView};

/// File name of the single-file weights.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// File name of the model configuration.
pub const CONFIG_FILE: &str = "config.json";

/// An opened MLX checkpoint: parsed `config.json` and every weight shard mapped and validated.
///
/// Tensors are looked up by name across shards; views borrow from the mappings, so the
/// checkpoint must outlive them (the borrow checker enforces this) and the files must not be
/// modified while it is open.
pub struct Checkpoint {
    dir: PathBuf,
    config: Value,
    quantization: Option<QuantConfig>,
    shards: Vec<SafetensorsFile>,
    /// Tensor name -> index into `shards`.
    locations: HashMap<String, usize>,
    /// Put before every name looked up ([`Checkpoint::set_prefix`]).
    prefix: String,
    /// Dotted name parts spelled otherwise in this checkpoint ([`Checkpoint::set_renames`]).
    renames: Vec<(String, String)>,
}

impl Checkpoint {
    /// Opens the checkpoint folder `dir`.
    ///
    /// Reads `config.json` (and its quantization block), then maps the shards named by
    /// `model.safetensors.index.json` if that file exists, else `model.safetensors`. With an
    /// index, the index is authoritative: every shard it names must exist and hold the tensors
    /// it places there; tensors a shard holds beyond those are not reachable by name.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable `config.json` or shard; [`Error::Json`] for invalid
    /// JSON in `config.json` or the index; [`Error::Config`] for a bad quantization block;
    /// [`Error::Index`], [`Error::MissingShard`], [`Error::ShardMissingTensor`] for an
    /// inconsistent index; [`Error::NoWeights`] when there are no weights; any header error of
    /// [`SafetensorsFile::open`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join(CONFIG_FILE);
        let config = read_json(&config_path)?;
        if !config.is_object() {
            return Err(Error::Config {
                path: config_path,
                key: String::new(),
                reason: "top level is not a JSON object".to_owned(),
            });
        }
        let quantization = QuantConfig::from_config(&config, &config_path)?;

        let index_path = dir.join(INDEX_FILE);
        let (shards, locations) = if index_path.exists() {
            open_sharded(&dir, &index_path)?
        } else {
            let path = dir.join(WEIGHTS_FILE);
            if !path.exists() {
                return Err(Error::NoWeights { dir });
            }
            let file = SafetensorsFile::open(&path)?;
            let locations = file.names().map(|n| (n.to_owned(), 0)).collect();
            (vec![file], locations)
        };
        Ok(Checkpoint { dir, config, quantization, shards, locations, prefix: String::new(), renames: Vec::new() })
    }

    /// Looks every name up under `prefix` from now on (`language_model.` for a model whose
    /// text weights sit inside a multimodal wrapper): `tensor("model.norm.weight")` then
    /// reads `language_model.model.norm.weight`, errors name the stored tensor, and
    /// [`Checkpoint::tensor_names`] lists only the names under the prefix, without it.
    pub fn set_prefix(&mut self, prefix: &str) {
        prefix.clone_into(&mut self.prefix);
    }

    /// Looks every name up with these parts respelled from now on: `(ours, theirs)` replaces
    /// the dotted parts `ours` by `theirs` wherever they stand between dots or at an end (LFM2
    /// stores `model.layers.0.mlp.gate_proj` as `model.layers.0.feed_forward.w1`), in order,
    /// after the prefix is put before the name. Errors name the stored tensor;
    /// [`Checkpoint::tensor_names`] lists the names as stored.
    pub fn set_renames(&mut self, renames: &[(&str, &str)]) {
        self.renames = renames.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect();
    }

    /// `name` as stored: under the prefix, with the renames applied.
    fn stored<'n>(&self, name: &'n str) -> std::borrow::Cow<'n, str> {
        if self.prefix.is_empty() && self.renames.is_empty() {
            return name.into();
        }
        // Dots at both ends, so that a part matches only whole between dots.
        let mut dotted = format!(".{}{name}.", self.prefix);
        for (ours, theirs) in &self.renames {
            dotted = dotted.replace(&format!(".{ours}."), &format!(".{theirs}."));
        }
        dotted[1..dotted.len() - 1].to_owned().into()
    }

    /// The checkpoint folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `config.json`, for the model definition to read.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The typed quantization block of `config.json`, if it has one.
    pub fn quantization(&self) -> Option<&QuantConfig> {
        self.quantization.as_ref()
    }

    /// The mapped shard files (one for an unsharded checkpoint), in index order.
    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    /// Number of tensors reachable by name.
    pub fn len(&self) -> usize {
        self.locations.len()
    }

    /// Whether the checkpoint holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    /// All tensor names under the prefix (without it), sorted; as stored, renames not undone.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.locations.keys().filter_map(|n| n.strip_prefix(self.prefix.as_str())).collect();
        names.sort_unstable();
        names
    }

    /// Whether tensor `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.locations.contains_key(self.stored(name).as_ref())
    }

    /// Tensor `name`, or `None` if it does not exist.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let name = self.stored(name);
        self.shards.get(*self.locations.get(name.as_ref())?)?.get(&name)
    }

    /// Tensor `name`, borrowing the mapped bytes (no copy).
    ///
    /// # Errors
    /// [`Error::MissingTensor`] naming the tensor and the checkpoint folder.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.get(name).ok_or_else(|| Error::MissingTensor {
            tensor: self.stored(name).into_owned(),
            checkpoint: self.dir.clone(),
        })
    }

    /// What `config.json` says about layer `prefix`: `None` without a quantization block.
    pub fn layer_quant(&self, prefix: &str) -> Option<LayerQuant> {
        self.quantization.as_ref().map(|q| q.for_layer(&self.stored(prefix)))
    }

    /// The linear layer at `prefix` (e.g. `model.layers.0.self_attn.q_proj`).
    ///
    /// Following MLX, the layer is quantized exactly when `<prefix>.scales` exists (mlx_lm
    /// leaves a layer dense when its input size is not a multiple of the group size, whatever
    /// the config says). A quantized layer needs `<prefix>.weight` (U32), `.scales` and
    /// `.biases`, with `bits`/`group_size` from the layer's override in the quantization block,
    /// else the global values. `<prefix>.bias` is optional in both cases.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] for a missing `.weight` (or `.biases` of a quantized layer);
    /// [`Error::Layer`] when `.scales` exists but the config has no quantization block or marks
    /// the layer unquantized; [`Error::WrongDtype`] / [`Error::WrongShape`] naming the tensor,
    /// the expected and the actual dtype or shape.
    pub fn linear(&self, prefix: &str) -> Result<Linear<'_>> {
        self.layer(prefix, Ok)
    }

    /// Expert `e` of the stacked expert layer at `prefix` (MLX's `SwitchLinear`,
    /// `switch_mlp.up_proj` and the like: weight `[experts, out, in]`, and for a quantized
    /// one scales and biases `[experts, out, groups]`), as a layer of its own; no copy.
    ///
    /// # Errors
    /// As [`Checkpoint::linear`]; [`Error::WrongShape`] when `e` is past the experts.
    pub fn expert(&self, prefix: &str, e: usize) -> Result<Linear<'_>> {
        self.layer(prefix, |t| t.outer(e))
    }

    /// The layer at `prefix` with each of its tensors passed through `pick`.
    fn layer<'a>(
        &'a self,
        prefix: &str,
        pick: impl Fn(TensorView<'a>) -> Result<TensorView<'a>>,
    ) -> Result<Linear<'a>> {
        let weight = pick(self.tensor(&format!("{prefix}.weight"))?)?;
        let bias = self.get(&format!("{prefix}.bias")).map(&pick).transpose()?;
        let Some(scales) = self.get(&format!("{prefix}.scales")) else {
            return Ok(Linear::Dense(DenseLinear::new(weight, bias)?));
        };
        let layer_error = |reason: &str| Error::Layer {
            checkpoint: self.dir.clone(),
            layer: self.stored(prefix).into_owned(),
            reason: reason.to_owned(),
        };
        let params = match self.layer_quant(prefix) {
            None => {
                return Err(layer_error("has a `.scales` tensor but config.json has no quantization block"));
            }
            Some(LayerQuant::Unquantized) => {
                return Err(layer_error("has a `.scales` tensor but config.json marks it unquantized (false)"));
            }
            Some(LayerQuant::Quantized(p)) => p,
        };
        // mlx-lm's `global_scale` option (nvfp4 with a second, per-tensor scale) is not read.
        if self.get(&format!("{prefix}.global_scale")).is_some() {
            return Err(layer_error(
                "has a `.global_scale` tensor (nvfp4 with a global scale), which is not supported",
            ));
        }
        // Affine layers have biases; the floating-point modes none.
        let biases = match params.mode {
            crate::QuantMode::Affine => Some(pick(self.tensor(&format!("{prefix}.biases"))?)?),
            _ => self.get(&format!("{prefix}.biases")).map(&pick).transpose()?,
        };
        Ok(Linear::Quantized(QuantizedLinear::new(weight, pick(scales)?, biases, bias, params)?))
    }

    /// The embedding table at `prefix` (e.g. `model.embed_tokens`): the same layout as a
    /// linear layer with one row per token, dense or quantized as a whole. Use
    /// [`Linear::rows_f32`] for a lookup and [`Linear::weight_f32`] for the whole table.
    ///
    /// # Errors
    /// As [`Checkpoint::linear`].
    pub fn embedding(&self, prefix: &str) -> Result<Linear<'_>> {
        self.linear(prefix)
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards)
            .field("tensors", &self.locations.len())
            .field("quantization", &self.quantization)
            .finish_non_exhaustive()
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&text).map_err(|source| Error::Json { path: path.to_path_buf(), source })
}

type Shards = (Vec<SafetensorsFile>, HashMap<String, usize>);

fn open_sharded(dir: &Path, index_path: &Path) -> Result<Shards> {
    let index = read_json(index_path)?;
    let bad = |reason: String| Error::Index { path: index_path.to_path_buf(), reason };
    let Some(Value::Object(weight_map)) = index.get("weight_map") else {
        return Err(bad("no `weight_map` object".to_owned()));
    };
    // Shard file name -> tensors the index places there, in a stable order.
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (tensor, shard) in weight_map {
        let Value::String(shard) = shard else {
            return Err(bad(format!("`weight_map` entry for `{tensor}` is not a file name: `{shard}`")));
        };
        let plain = !shard.is_empty() && Path::new(shard).components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(bad(format!(
                "`weight_map` entry for `{tensor}` names `{shard}`, not a file inside the checkpoint folder"
            )));
        }
        by_shard.entry(shard).or_default().push(tensor);
    }

    let mut shards = Vec::with_capacity(by_shard.len());
    let mut locations = HashMap::with_capacity(weight_map.len());
    for (shard, tensors) in by_shard {
        let path = dir.join(shard);
        if !path.exists() {
            return Err(Error::MissingShard {
                index: index_path.to_path_buf(),
                shard: path,
                tensor: tensors.first().map(|t| (*t).to_owned()).unwrap_or_default(),
            });
        }
        let file = SafetensorsFile::open(&path)?;
        for tensor in tensors {
            if !file.contains(tensor) {
                return Err(Error::ShardMissingTensor {
                    index: index_path.to_path_buf(),
                    shard: path,
                    tensor: tensor.to_owned(),
                });
            }
            locations.insert(tensor.to_owned(), shards.len());
        }
        shards.push(file);
    }
    Ok((shards, locations))
}
