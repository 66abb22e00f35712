//! `third_party/pins.toml`: the pinned external toolchain, read by every step.

use anyhow::{Context, Result};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Pins {
    #[serde(rename = "iree-compiler")]
    pub iree_compiler: IreeCompiler,
    #[serde(rename = "iree-runtime")]
    pub iree_runtime: IreeRuntime,
    #[serde(rename = "cuda-headers")]
    pub cuda_headers: CudaHeaders,
    #[serde(rename = "python-tools")]
    pub python_tools: PythonTools,
    pub llvm: Llvm,
    pub system: System,
    pub oracle: Oracle,
    #[serde(rename = "test-clients")]
    pub test_clients: TestClients,
}

#[derive(Debug, Deserialize)]
pub struct IreeCompiler {
    pub pypi: String,
    pub version: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct IreeRuntime {
    #[serde(rename = "crate")]
    pub krate: String,
    pub version: String,
    pub sha256: String,
    pub subdir: String,
    pub iree_version: String,
}

/// The PyPI wheels whose headers build the CUDA HAL driver when no toolkit is installed.
#[derive(Debug, Deserialize)]
pub struct CudaHeaders {
    /// pip `--platform` of the files pinned (the headers do not depend on it).
    pub platform: String,
    pub wheels: Vec<CudaWheel>,
}

#[derive(Debug, Deserialize)]
pub struct CudaWheel {
    pub pypi: String,
    pub version: String,
    pub sha256: String,
    /// `folder in the wheel:folder under target/iree/cuda-deps`, each copied whole.
    pub extract: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct PythonTools {
    pub cmake: String,
    pub ninja: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Llvm {
    pub version: String,
    pub prefix: String,
    pub debian_packages: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct System {
    pub debian_packages: Vec<String>,
}

/// Client libraries the server tests run.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TestClients {
    pub python_packages: Vec<String>,
}

/// The mlx-lm reference (fixtures, real-model oracle) and the default real model.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Oracle {
    pub python_packages: Vec<String>,
    pub model_wheel: String,
    /// Path of the GGUF inside the wheel.
    pub model_file: String,
    pub model_sha256: String,
    pub model_name: String,
    pub q4_group_size: u32,
    pub oracle_steps: u32,
}

impl Pins {
    pub fn load() -> Result<Pins> {
        let path = crate::util::root().join("third_party/pins.toml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
}
