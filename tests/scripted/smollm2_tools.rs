//! SmolLM2 that takes tools: a real checkpoint for the forced calls of `tool_choice`, shared
//! by crates/server/tests/http.rs and crates/mlx-iree/tests/openai.rs (each includes this
//! file by path). Its config and weights are SmolLM2's own, so it shares their compiled
//! modules; only the text side differs.

use std::path::Path;

/// A chat template in the Hermes style for SmolLM2 with tools: the tools named in a system
/// turn (their names only, so a prompt fits the tests' context), calls in the history written
/// as `<tool_call>` JSON, tool results as `tool` turns.
pub const TOOLS_TEMPLATE: &str = "\
{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}\
Call one as <tool_call> JSON.<|im_end|>\n{% endif %}\
{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\
{% for tool_call in m.tool_calls or [] %}{% set tool_call = tool_call.function %}<tool_call>\n\
{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}\n</tool_call>\
{% endfor %}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Writes into `dir` the SmolLM2 of `model` (its config and weights) with two unused special
/// tokens renamed `<tool_call>` and `</tool_call>` (ordinary added tokens, as in Qwen's
/// vocabulary) and [`TOOLS_TEMPLATE`].
pub fn write(model: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for file in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(model.join(file), dir.join(file)).unwrap();
    }
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("tokenizer.json")).unwrap()).unwrap();
    for (id, old, new) in [(3, "<repo_name>", "<tool_call>"), (4, "<reponame>", "</tool_call>")] {
        let added = &mut tokenizer["added_tokens"][id];
        assert_eq!(added["content"], old);
        added["content"] = serde_json::json!(new);
        added["special"] = serde_json::json!(false);
        let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
        assert_eq!(vocab.remove(old), Some(serde_json::json!(id)));
        vocab.insert(new.to_owned(), serde_json::json!(id));
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = serde_json::json!({"chat_template": TOOLS_TEMPLATE, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}
