//! [`Plan`]: the static shapes an engine compiles at load (cache, decode batches, prefill
//! chunks, attention windows, mixed calls) and which of them serves a given call.

use crate::config::FALLBACK_CONTEXT;
use crate::{DecodeBatches, EngineConfig, Error, Result};
use models::{CacheShape, Function, Layout, ModelConfig};

/// The static shapes an engine compiles at load, so no request ever compiles: the cache,
/// the decode batch sizes, the prefill chunk sizes and the attention windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub cache: CacheShape,
    /// Rows per decode call: powers of two below `max_batch`, and `max_batch`; or only 1 and
    /// `max_batch` (`DecodeBatches`).
    pub batches: Vec<usize>,
    /// Tokens per prefill call.
    pub chunks: Vec<usize>,
    /// Positions prefill's attention reads: powers of two from 128 below the context, and
    /// the context; or only the context ([`Plan::for_layout`]).
    pub windows: Vec<usize>,
    /// Positions decode's attention reads: the same windows, or only the context where a
    /// step's attention costs what the context holds whatever its window ([`Plan::for_layout`]).
    pub decode_windows: Vec<usize>,
    /// What one call costs beyond its rows, in rows (`CompileTarget::call_overhead_rows`): how
    /// prefill weighs padding against more calls.
    pub call_rows: usize,
    /// Rows per mixed call (several sequences' prompt chunks and decode rows in one call,
    /// `Function::Mixed`): empty unless the attention kernel runs and there are several
    /// slots ([`Plan::for_layout`]).
    pub mixed: Vec<usize>,
    /// The recurrent state's buffers, f32 values per slot each (`ModelConfig::state_parts`;
    /// empty for a model of attention layers only): beside the KV cache, written by
    /// `write_state` after each call.
    pub state_parts: Vec<usize>,
    /// Per state buffer, whether the step functions update it in place and return it whole
    /// instead of returning rows for `write_state` (`models::graph::state_in_place`; none
    /// until [`Plan::for_layout`]).
    pub state_in_place: Vec<bool>,
    /// Rows per verify call (`Function::Verify`: a decode row and the draft tokens after it,
    /// speculative decoding), `None` without drafts.
    pub verify: Option<usize>,
    /// Rows of a call that verifies several decoding sequences' drafts at once (a mixed call
    /// returning every row's logits, `Function::Mixed` with as many outputs as rows): as many
    /// as a verify call's, so it costs what one sequence's check costs (on a CPU a row of a
    /// call costs its arithmetic, padding included), the sequences sharing its rows; where
    /// the plan has mixed calls and drafts ([`Plan::for_layout`]).
    pub verify_mixed: Option<usize>,
    /// Whether the copies between slots are compiled: several slots, on a target where they
    /// compile (`CompileTarget::copies_between_slots`).
    pub copies: bool,
    /// A model with recurrent layers and drafts: the state past the sequences' (the state
    /// buffers' last, `CacheShape::scratch`; the KV cache has no row for it) that holds a
    /// copy of a sequence's state from before its verify call, which `Engine::truncate`
    /// restores when drafts are rejected. Never a sequence's.
    pub scratch: Option<usize>,
}

/// Prompt chunk sizes: short prompts in 16-token calls, long ones in 128-token calls.
const CHUNKS: [usize; 2] = [16, 128];
/// The smallest attention window.
const MIN_WINDOW: usize = 128;
/// Positions one `copy_kv` call copies between slots (fewer where the context is shorter).
pub(crate) const COPY_BLOCK: usize = 128;
/// Rows per mixed call: a few new prompts beside the decode rows, and a burst of short
/// prompts at once, in steps of 16 so a burst pads little (with only 16 and 64, SmolLM2's
/// p99 time to first token at 8 streams was 0.20-0.27 s, with these 0.16-0.19 s:
/// docs/PERFORMANCE.md). The largest also takes every slot's decode row plus a 16-token
/// chunk (`Plan::for_layout` adds a size for many slots).
const MIXED_ROWS: [usize; 4] = [16, 32, 48, 64];

impl Plan {
    /// The plan for `cfg` under `config`, or why it cannot run (a context that does not fit
    /// the budget, zero sizes).
    pub fn new(cfg: &ModelConfig, config: &EngineConfig) -> Result<Plan> {
        if config.max_batch == 0 {
            return Err(Error::ZeroBatch);
        }
        let target = crate::CompileTarget::for_device(&config.device)?;
        config.draft.check(cfg)?;
        let verify = match config.draft.tokens() {
            0 if config.draft != crate::Draft::Off => return Err(Error::ZeroDraftTokens),
            0 => None,
            tokens => Some(tokens + 1),
        };
        // Drafts on a model with recurrent layers: its state before each verify call is kept in
        // a scratch state (copies between slots, which only some targets compile).
        let scratch = verify.is_some() && cfg.state_len() > 0;
        if scratch && !target.copies_between_slots() {
            return Err(Error::DraftWithState { model_type: cfg.model_type.clone(), target: target.to_string() });
        }
        let slots = config.max_batch;
        config.kv_elem.check(cfg).map_err(Error::KvCache)?;
        let per_position = CacheShape::bytes_per_position(cfg, config.kv_elem);
        let positions = match config.max_context {
            Some(0) => return Err(Error::ZeroContext),
            Some(n) => n,
            None => {
                let model = cfg.max_position_embeddings.unwrap_or(FALLBACK_CONTEXT);
                let fits = config.kv_budget_bytes / (per_position * slots);
                if fits == 0 {
                    return Err(Error::BudgetTooSmall { budget: config.kv_budget_bytes, slots, per_position });
                }
                model.min(fits)
            }
        };
        let cache = CacheShape { slots, positions, elem: config.kv_elem, scratch };
        let mut batches: Vec<usize> = match config.decode_batches {
            DecodeBatches::PowersOfTwo => (0..).map(|i| 1 << i).take_while(|b| *b < config.max_batch).collect(),
            DecodeBatches::OneOrAll => (config.max_batch > 1).then_some(1).into_iter().collect(),
        };
        batches.push(config.max_batch);
        // Only chunks smaller than the context: a chunk the size of the whole context (128 at
        // 128 positions) is one more compiled prefill and cache write (a third of a small
        // model's compile) to save a few 16-token calls on prompts that are the context.
        let mut chunks: Vec<usize> = CHUNKS.iter().copied().filter(|c| *c < positions).collect();
        if chunks.is_empty() {
            chunks.push(positions);
        }
        let mut windows: Vec<usize> = (0..).map(|i| MIN_WINDOW << i).take_while(|w| *w < positions).collect();
        windows.push(positions);
        let call_rows = target.call_overhead_rows();
        // Never more rows than the context.
        let verify = verify.map(|rows| rows.min(positions));
        Ok(Plan {
            cache,
            batches,
            chunks,
            decode_windows: windows.clone(),
            windows,
            call_rows,
            mixed: Vec::new(),
            state_parts: cfg.state_parts(),
            state_in_place: vec![false; cfg.state_parts().len()],
            verify,
            verify_mixed: None,
            copies: slots > 1 && target.copies_between_slots(),
            scratch: scratch.then_some(config.max_batch),
        })
    }

    /// The plan for graphs of `layout`: where attention runs in the CPU kernel
    /// (`models::graph::attention_in_kernel`), which reads only the positions in use, one
    /// window (the context) per batch size and chunk instead of one per window: the same
    /// speed at every context, and a fraction of the functions to compile.
    ///
    /// With several slots there, also the mixed calls: every sequence's new tokens (prompt
    /// chunks and decode rows) in one call per step, as the kernel tells sequences apart by
    /// slot, where prompts otherwise take a call each (docs/PERFORMANCE.md, "Prompts beside
    /// decode rows"); not for a model with recurrent layers, whose scan takes one sequence's
    /// rows at a time. With drafts, one more mixed call: every sequence's drafts verified
    /// together ([`Plan::verify_mixed`]).
    pub fn for_layout(mut self, cfg: &ModelConfig, layout: &Layout) -> Plan {
        self.state_in_place = models::graph::state_in_place(cfg, layout);
        if models::graph::attention_in_kernel(cfg, layout) {
            self.decode_windows = vec![self.cache.positions];
            self.windows = vec![self.cache.positions];
            if self.cache.slots > 1 && models::graph::mixed_calls(cfg, layout) {
                self.mixed = MIXED_ROWS.to_vec();
                let most = (self.cache.slots + MIXED_ROWS[0]).next_power_of_two();
                if most > MIXED_ROWS[MIXED_ROWS.len() - 1] {
                    self.mixed.push(most);
                }
                // Drafts of several sequences checked in one call (mixed calls exclude the
                // recurrent layers, the only ones a rejected draft needs a scratch state for).
                self.verify_mixed = self.verify;
            }
        }
        self
    }

    /// Every function the engine can call.
    pub fn functions(&self) -> Vec<Function> {
        let prefill = self.chunks.iter().flat_map(|&tokens| {
            self.windows.iter().filter(move |w| **w >= tokens).map(move |&window| Function::Prefill { tokens, window })
        });
        let decode = self
            .batches
            .iter()
            .flat_map(|&rows| self.decode_windows.iter().map(move |&window| Function::Decode { rows, window }));
        let (outs, window) = (self.cache.slots, self.cache.positions);
        let mixed = self.mixed.iter().map(move |&rows| Function::Mixed { rows, outs, window });
        let verify_mixed = self.verify_mixed.map(|rows| Function::Mixed { rows, outs: rows, window });
        let verify = self.verify.into_iter().flat_map(|tokens| {
            self.windows.iter().filter(move |w| **w >= tokens).map(move |&window| Function::Verify { tokens, window })
        });
        let mut writes: Vec<usize> = (self.batches.iter().chain(&self.chunks).chain(&self.mixed))
            .chain(&self.verify)
            .chain(&self.verify_mixed)
            .copied()
            .collect();
        writes.sort_unstable();
        writes.dedup();
        // A prefill writes one sequence's state, a decode call its rows' (the batch sizes).
        let scatters = self.state_in_place.iter().any(|in_place| !in_place);
        let states = self.batches.iter().filter(|_| scatters).map(|&rows| Function::WriteState { rows });
        // Where copies are planned, a prompt's start can be copied from one slot to another (the
        // scheduler's prefix cache), state and all.
        let copies = self.copies.then_some(Function::CopyKv { positions: self.copy_block() });
        // And a verify call's state is kept in the scratch state, even with one slot.
        let copy_state =
            ((self.copies || self.scratch.is_some()) && !self.state_parts.is_empty()).then_some(Function::CopyState);
        prefill
            .chain(decode)
            .chain(mixed)
            .chain(verify)
            .chain(verify_mixed)
            .chain(writes.into_iter().map(|rows| Function::WriteKv { rows }))
            .chain(states)
            .chain(copies)
            .chain(copy_state)
            .collect()
    }

    /// Slots for sequences: the cache's.
    pub fn slots(&self) -> usize {
        self.cache.slots
    }

    /// Positions one `copy_kv` call copies.
    pub(crate) fn copy_block(&self) -> usize {
        COPY_BLOCK.min(self.cache.positions)
    }

    /// The call verifying several sequences' drafts at once, for `rows` rows in all: `None`
    /// without one, or where they are more than it takes.
    pub(crate) fn verify_mixed(&self, rows: usize) -> Option<Function> {
        let width = self.verify_mixed.filter(|w| *w >= rows)?;
        Some(Function::Mixed { rows: width, outs: width, window: self.cache.positions })
    }

    /// The mixed call for `rows` rows, if the plan has one that large.
    pub(crate) fn mixed(&self, rows: usize) -> Option<Function> {
        let rows = self.mixed.iter().copied().find(|r| *r >= rows)?;
        Some(Function::Mixed { rows, outs: self.cache.slots, window: self.cache.positions })
    }

    /// The verify call for a sequence whose next row is at position `start`: `None` without
    /// drafts, or where its rows would pass the end of the slot.
    pub(crate) fn verify(&self, start: usize) -> Option<Function> {
        let tokens = self.verify?;
        if start + tokens > self.cache.positions {
            return None;
        }
        Some(Function::Verify { tokens, window: self.window(start + tokens)? })
    }

    /// The smallest window holding positions `[0, end)`.
    pub(crate) fn window(&self, end: usize) -> Option<usize> {
        self.windows.iter().copied().find(|w| *w >= end)
    }

    /// The decode call for `rows` rows whose highest position is `top`.
    pub(crate) fn decode(&self, rows: usize, top: usize) -> Option<Function> {
        let rows = self.batches.iter().copied().find(|b| *b >= rows)?;
        let window = self.decode_windows.iter().copied().find(|w| *w > top)?;
        Some(Function::Decode { rows, window })
    }

    /// The prefill call for the next of `remaining` prompt tokens at `start`: the first call
    /// of the cheapest run of chunks covering them, a call costing its rows (padding
    /// included) plus `call_rows`; ties go to the larger chunk. Never one whose padding would
    /// pass the end of the slot. `None` when no chunk fits there (the caller feeds single
    /// tokens).
    pub(crate) fn prefill(&self, start: usize, remaining: usize) -> Option<Function> {
        let fits: Vec<usize> = self.chunks.iter().copied().filter(|c| start + c <= self.cache.positions).collect();
        let largest = *fits.last()?;
        // A full largest chunk costs the least per token, so it goes first while it fills;
        // under that, best[r] is the cheapest cover of r tokens (a small table: r < largest).
        let tokens = if remaining >= largest {
            largest
        } else {
            let cost = |c: usize| c + self.call_rows;
            let mut best = vec![0usize; remaining + 1];
            for r in 1..=remaining {
                best[r] = fits.iter().map(|&c| cost(c) + best[r.saturating_sub(c)]).min()?;
            }
            *fits.iter().rev().min_by_key(|&&c| cost(c) + best[remaining.saturating_sub(c)])?
        };
        Some(Function::Prefill { tokens, window: self.window(start + tokens)? })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::DEFAULT_KV_BUDGET;
    use crate::{Backend, CompileTarget, KernelSetting, KvElem, Precision};
    use std::path::Path;
    use weights::Checkpoint;

    /// The qwen2 fixture's config (also for the other modules' tests).
    pub(crate) fn cfg() -> ModelConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
        ModelConfig::from_file(&dir.join("config.json")).unwrap()
    }

    /// An f32 engine on local-task with these slots and context.
    pub(crate) fn config(max_batch: usize, max_context: Option<usize>) -> EngineConfig {
        EngineConfig { max_batch, max_context, ..EngineConfig::new("local-task", Precision::F32, "/nonexistent") }
    }

    #[test]
    fn plan_sizes() {
        let p = Plan::new(&cfg(), &config(8, Some(1000))).unwrap();
        assert_eq!(p.batches, [1, 2, 4, 8]);
        assert_eq!(p.chunks, [16, 128]);
        assert_eq!(p.windows, [128, 256, 512, 1000]);
        assert_eq!(p.cache.slots, 8);
        let p = Plan::new(&cfg(), &config(6, Some(64))).unwrap();
        assert_eq!(
            (p.batches.as_slice(), p.chunks.as_slice(), p.windows.as_slice()),
            (&[1, 2, 4, 6][..], &[16][..], &[64][..])
        );
        let p = Plan::new(&cfg(), &config(1, Some(128))).unwrap();
        assert_eq!((p.chunks.as_slice(), p.windows.as_slice()), (&[16][..], &[128][..]));
        let p = Plan::new(&cfg(), &config(1, Some(129))).unwrap();
        assert_eq!((p.chunks.as_slice(), p.windows.as_slice()), (&[16, 128][..], &[128, 129][..]));
        let p = Plan::new(&cfg(), &config(1, Some(16))).unwrap();
        assert_eq!(p.chunks, [16]);
        let p = Plan::new(&cfg(), &config(1, Some(10))).unwrap();
        assert_eq!((p.batches.as_slice(), p.chunks.as_slice(), p.windows.as_slice()), (&[1][..], &[10][..], &[10][..]));
        // Every prefill function's chunk fits its window.
        for f in Plan::new(&cfg(), &config(3, Some(300))).unwrap().functions() {
            if let Function::Prefill { tokens, window } = f {
                assert!(tokens <= window, "{f:?}");
            }
        }
    }

    /// One row or all of them: no decode calls or cache writes of 2 and 4 rows, and a step of
    /// 3 sequences runs the 8-row call; with one slot, the one call of one row.
    #[test]
    fn decode_batches_of_one_or_all() {
        let one_or_all =
            |max_batch| EngineConfig { decode_batches: DecodeBatches::OneOrAll, ..config(max_batch, Some(64)) };
        let p = Plan::new(&cfg(), &one_or_all(8)).unwrap();
        assert_eq!(p.batches, [1, 8]);
        assert_eq!(p.decode(3, 10), Some(Function::Decode { rows: 8, window: 64 }));
        assert_eq!(p.decode(1, 10), Some(Function::Decode { rows: 1, window: 64 }));
        let f = p.functions();
        for gone in [Function::Decode { rows: 2, window: 64 }, Function::Decode { rows: 4, window: 64 }] {
            assert!(!f.contains(&gone), "{gone:?} in {f:?}");
        }
        let writes: Vec<usize> =
            f.iter().filter_map(|f| if let Function::WriteKv { rows } = f { Some(*rows) } else { None }).collect();
        assert_eq!(writes, [1, 8, 16]);
        let full = Plan::new(&cfg(), &config(8, Some(64))).unwrap().functions();
        assert_eq!(full.len(), f.len() + 4, "decode and write_kv of 2 and 4 rows");
        assert_eq!(Plan::new(&cfg(), &one_or_all(1)).unwrap().batches, [1]);
    }

    /// An 8-bit cache takes 5/16 of f32's bytes (16 values and an f32 scale in 20 bytes), so
    /// a budget holds 3.2 times the positions; rows that are not whole blocks are refused.
    #[test]
    fn an_8_bit_cache_is_whole_blocks_of_16_in_5_16ths_of_the_bytes() {
        let c = cfg();
        let per = |kv| CacheShape::bytes_per_position(&c, kv);
        assert_eq!(per(KvElem::Q8) * 16, per(KvElem::F32) * 5);
        let q8 = EngineConfig { kv_elem: KvElem::Q8, ..config(2, Some(64)) };
        let p = Plan::new(&c, &q8).unwrap();
        assert_eq!(p.cache.dims(&c)[0], [c.kv_layers(), 2, 64, c.kv_heads, c.head_dim / 16 * 20]);
        assert_eq!(p.cache.bytes(&c), 2 * 64 * per(KvElem::Q8));
        let mut odd = cfg();
        odd.head_dim = 24;
        odd.layers.iter_mut().for_each(|l| l.head_dim = 24);
        assert_eq!(
            Plan::new(&odd, &q8).unwrap_err().to_string(),
            "--kv-cache q8 stores blocks of 16 values of a cache row, and this model's rows have 24"
        );
        assert!(Plan::new(&odd, &config(2, Some(64))).is_ok());
    }

    #[test]
    fn context_from_the_model_capped_by_the_budget() {
        let c = cfg();
        let per = CacheShape::bytes_per_position(&c, KvElem::F32);
        let model = c.max_position_embeddings.unwrap_or(FALLBACK_CONTEXT);
        let p = Plan::new(&c, &config(2, None)).unwrap();
        assert_eq!(p.cache.positions, model.min(DEFAULT_KV_BUDGET / (2 * per)));
        let tight = EngineConfig { kv_budget_bytes: per * 2 * 100, ..config(2, None) };
        assert_eq!(Plan::new(&c, &tight).unwrap().cache.positions, 100.min(model));
        let none = EngineConfig { kv_budget_bytes: 1, ..config(2, None) };
        let err = Plan::new(&c, &none).unwrap_err().to_string();
        assert!(err.starts_with("a KV budget of 1 bytes holds no position for 2 sequences"), "{err}");
        assert_eq!(Plan::new(&c, &config(0, None)).unwrap_err().to_string(), "max batch must be at least 1");
    }

    /// Where the CPU kernel runs attention (packed weights on llvm-cpu, a host with a kernel
    /// object), decode and prefill are compiled for one window, the context, and their graphs
    /// dispatch the kernel; dense weights keep every window and the graph form.
    #[test]
    fn one_window_where_the_kernel_attends() {
        let c = cfg();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/q4");
        let ckpt = Checkpoint::open(&dir).unwrap();
        let cache_dir = std::env::temp_dir().join(format!("engine-plan-{}", std::process::id()));
        let backend = Backend::new(CompileTarget::HostCpu, KernelSetting::Auto, &cache_dir).unwrap();
        let packed = backend.layout(&c, Precision::Packed, &ckpt).unwrap();
        let dense = Layout::dense(&c, Precision::F32);
        let plan = Plan::new(&c, &config(4, Some(300))).unwrap();
        assert_eq!(plan.decode_windows, plan.windows);
        assert_eq!(plan.clone().for_layout(&c, &dense), plan);
        let decodes = |p: &Plan| -> Vec<Function> {
            p.functions().into_iter().filter(|f| matches!(f, Function::Decode { .. })).collect()
        };
        assert_eq!(decodes(&plan).len(), plan.batches.len() * plan.windows.len());
        let text = |layout: &Layout, plan: &Plan| -> String {
            backend.graph_modules(&c, layout, plan).unwrap().iter().map(|m| m.mlir.clone()).collect()
        };
        assert!(!text(&dense, &plan).contains("@attn_f32_u"));
        if kernels::cpu::host_isa().is_some() {
            let kernel = plan.clone().for_layout(&c, &packed);
            assert_eq!((kernel.decode_windows.as_slice(), kernel.windows.as_slice()), (&[300][..], &[300][..]));
            assert_eq!((&kernel.batches, &kernel.chunks), (&plan.batches, &plan.chunks));
            let prefills: Vec<Function> =
                kernel.functions().into_iter().filter(|f| matches!(f, Function::Prefill { .. })).collect();
            let chunk_each: Vec<Function> =
                plan.chunks.iter().map(|&tokens| Function::Prefill { tokens, window: 300 }).collect();
            assert_eq!(prefills, chunk_each);
            let rows: Vec<usize> = kernel.batches.clone();
            let one_each: Vec<Function> = rows.iter().map(|&rows| Function::Decode { rows, window: 300 }).collect();
            assert_eq!(decodes(&kernel), one_each);
            assert_eq!(kernel.decode(3, 0), Some(Function::Decode { rows: 4, window: 300 }));
            assert_eq!(kernel.decode(1, 299), Some(Function::Decode { rows: 1, window: 300 }));
            assert_eq!(kernel.decode(1, 300), None);
            // Mixed calls (4 slots): 16 to 64 rows in steps of 16, logits for every slot.
            let mixed: Vec<Function> =
                kernel.functions().into_iter().filter(|f| matches!(f, Function::Mixed { .. })).collect();
            let sizes = [16, 32, 48, 64].map(|rows| Function::Mixed { rows, outs: 4, window: 300 });
            assert_eq!(mixed, sizes);
            assert_eq!(kernel.mixed(17), Some(sizes[1]));
            assert_eq!(kernel.mixed(64), Some(sizes[3]));
            assert_eq!(kernel.mixed(65), None);
            assert!(plan.mixed.is_empty(), "no mixed calls without the attention kernel");
            // The largest takes every slot's decode row beside a 16-token chunk; one slot
            // has no use for them.
            let slots = |n: usize| Plan::new(&c, &config(n, Some(300))).unwrap().for_layout(&c, &packed).mixed;
            assert_eq!((slots(48), slots(49), slots(1)), (vec![16, 32, 48, 64], vec![16, 32, 48, 64, 128], vec![]));
            assert_eq!(kernel.verify_mixed, None, "no drafts, no call verifying several sequences");
            // With 4 drafts a sequence, one call of a verify call's 5 rows checks several
            // sequences' drafts, every row's logits out.
            let drafts = EngineConfig { draft: crate::Draft::Ngram { tokens: 4 }, ..config(4, Some(300)) };
            let drafting = Plan::new(&c, &drafts).unwrap().for_layout(&c, &packed);
            let together = Function::Mixed { rows: 5, outs: 5, window: 300 };
            assert_eq!(drafting.verify_mixed, Some(5));
            assert!(drafting.functions().contains(&together));
            assert_eq!(
                (drafting.verify_mixed(2), drafting.verify_mixed(5), drafting.verify_mixed(6)),
                (Some(together), Some(together), None)
            );
            // One attention dispatch per layer per function: a prompt chunk's in whole rows a
            // workgroup (its tiles share the cache's reads), the others' a row's kv heads.
            let mlir = text(&packed, &kernel);
            let entry = |units: usize| format!("entry_points = [@mlx_iree_kernels::@attn_f32_u{units}]");
            let per_call = c.num_layers() * (one_each.len() + mixed.len());
            assert_eq!(mlir.matches(&entry(1)).count(), per_call, "{mlir}");
            let tiled = entry(kernels::cpu::attention_tile_units(c.kv_heads));
            assert_eq!(mlir.matches(&tiled).count(), c.num_layers() * chunk_each.len(), "{mlir}");
        }
        let _ = std::fs::remove_dir_all(&cache_dir);
    }

    /// Where the CPU kernels are linked, each DeltaNet matrix is updated in place by the
    /// step (one `delta` dispatch per linear layer per function) and `write_state` scatters
    /// only the convolution inputs; the graph form returns rows for every buffer.
    #[test]
    fn the_delta_kernel_updates_the_matrices_in_place() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_5/q4");
        let mut ckpt = Checkpoint::open(&dir).unwrap();
        let c = ModelConfig::for_checkpoint(&mut ckpt).unwrap();
        let linear = c.layers.iter().filter(|l| l.recurrent).count();
        let cache_dir = std::env::temp_dir().join(format!("engine-plan-delta-{}", std::process::id()));
        let backend = Backend::new(CompileTarget::HostCpu, KernelSetting::Auto, &cache_dir).unwrap();
        let dense = Layout::dense(&c, Precision::F32);
        let plan = Plan::new(&c, &config(2, Some(64))).unwrap();
        let graph = plan.clone().for_layout(&c, &dense);
        assert_eq!(graph.state_in_place, vec![false; 2 * linear]);
        let text = |layout: &Layout, plan: &Plan| -> String {
            backend.graph_modules(&c, layout, plan).unwrap().iter().map(|m| m.mlir.clone()).collect()
        };
        assert!(!text(&dense, &graph).contains("@delta"));
        if kernels::cpu::host_isa().is_some() {
            let packed = backend.layout(&c, Precision::Packed, &ckpt).unwrap();
            let kernel = plan.clone().for_layout(&c, &packed);
            assert_eq!(kernel.state_in_place, [false, true].repeat(linear));
            let functions = kernel.functions();
            let steps = functions.iter().filter(|f| matches!(f, Function::Prefill { .. } | Function::Decode { .. }));
            let mlir = text(&packed, &kernel);
            let dispatches = mlir.matches("entry_points = [@mlx_iree_kernels::@delta]").count();
            assert_eq!(dispatches, linear * steps.count(), "{mlir}");
            // write_state_n2 takes the slots, then the new rows and the buffer of each
            // convolution part only.
            let (conv, matrix) = (c.state_parts()[0], c.state_parts()[1]);
            let head = mlir.split("@write_state_n2(").nth(1).unwrap().split(')').next().unwrap().to_owned();
            assert_eq!(head.matches(&format!("x{conv}xf32>")).count(), 2 * linear, "{head}");
            assert_eq!(head.matches("xf32>").count(), 2 * linear, "{head}");
            assert!(!head.contains(&format!("x{matrix}xf32>")), "{head}");
        }
        let _ = std::fs::remove_dir_all(&cache_dir);
    }

    #[test]
    fn calls_pick_the_smallest_fitting_shape() {
        let p = Plan::new(&cfg(), &config(8, Some(1000))).unwrap();
        assert_eq!(p.decode(1, 0), Some(Function::Decode { rows: 1, window: 128 }));
        assert_eq!(p.decode(3, 128), Some(Function::Decode { rows: 4, window: 256 }));
        assert_eq!(p.decode(8, 999), Some(Function::Decode { rows: 8, window: 1000 }));
        assert_eq!(p.decode(9, 0), None);
        assert_eq!(p.prefill(0, 5), Some(Function::Prefill { tokens: 16, window: 128 }));
        // On a CPU padding costs what real rows do: 37 tokens in three 16-token calls, 100
        // in one of 128 (cheaper than seven of 16 once each call's overhead counts).
        assert_eq!(p.prefill(0, 37), Some(Function::Prefill { tokens: 16, window: 128 }));
        assert_eq!(p.prefill(0, 100), Some(Function::Prefill { tokens: 128, window: 128 }));
        assert_eq!(p.prefill(128, 300), Some(Function::Prefill { tokens: 128, window: 256 }));
        // Near the end of the slot: only chunks whose padding stays inside it.
        assert_eq!(p.prefill(900, 50), Some(Function::Prefill { tokens: 16, window: 1000 }));
        assert_eq!(p.prefill(990, 5), None);
        // On a GPU a call costs its dispatches, whatever its rows: the fewest calls.
        let gpu = Plan::new(&cfg(), &EngineConfig { device: "cuda".into(), ..config(8, Some(1000)) }).unwrap();
        assert_eq!(gpu.prefill(0, 37), Some(Function::Prefill { tokens: 128, window: 128 }));
        assert_eq!(gpu.prefill(0, 5), Some(Function::Prefill { tokens: 16, window: 128 }));
        // Every call the plan picks is one it compiles.
        let all = p.functions();
        for start in (0..1000).step_by(7) {
            for remaining in [1, 15, 16, 17, 200] {
                if let Some(f) = p.prefill(start, remaining) {
                    assert!(all.contains(&f), "{f:?}");
                }
            }
            for rows in 1..=8 {
                assert!(all.contains(&p.decode(rows, start).unwrap()));
            }
        }
    }

    /// With drafts, one verify call of the draft tokens plus one per window that holds them,
    /// and its cache write; for a model with recurrent layers, a scratch state and the copies
    /// too, or a refusal where those do not compile.
    #[test]
    fn drafts_add_a_verify_call_per_window() {
        let drafts = |tokens: usize| EngineConfig { draft: crate::Draft::Ngram { tokens }, ..config(2, Some(300)) };
        let p = Plan::new(&cfg(), &drafts(4)).unwrap();
        assert_eq!(p.verify, Some(5));
        let all = p.functions();
        let verify: Vec<Function> = all.iter().copied().filter(|f| matches!(f, Function::Verify { .. })).collect();
        assert_eq!(verify, [128, 256, 300].map(|window| Function::Verify { tokens: 5, window }));
        assert!(all.contains(&Function::WriteKv { rows: 5 }));
        assert_eq!(p.verify(0), Some(verify[0]));
        assert_eq!(p.verify(124), Some(verify[1]));
        assert_eq!(p.verify(295), Some(verify[2]));
        assert_eq!(p.verify(296), None, "its rows would pass the end of the slot");
        let off = Plan::new(&cfg(), &config(2, Some(300))).unwrap();
        assert_eq!((off.verify, off.verify(0)), (None, None));
        assert!(!off.functions().iter().any(|f| matches!(f, Function::Verify { .. })));
        assert!(matches!(Plan::new(&cfg(), &drafts(0)), Err(Error::ZeroDraftTokens)));
        assert_eq!((p.scratch, p.slots(), p.cache.slots), (None, 2, 2));
        // A model with recurrent layers: a scratch state past the sequences' for the state
        // from before a verify call (no KV rows: the budget's context is the sequences'), and
        // the copies; refused where copies do not compile.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_5/f32");
        let recurrent = ModelConfig::for_checkpoint(&mut Checkpoint::open(&dir).unwrap()).unwrap();
        for max_batch in [1, 2] {
            let config = EngineConfig { max_batch, ..drafts(4) };
            let r = Plan::new(&recurrent, &config).unwrap();
            assert_eq!((r.scratch, r.slots(), r.cache.slots), (Some(max_batch), max_batch, max_batch));
            assert_eq!((r.cache.scratch, r.cache.state_slots()), (true, max_batch + 1));
            // A budget of 100 positions a sequence gives each sequence 100 (the scratch state
            // takes no KV rows).
            let per_position = CacheShape::bytes_per_position(&recurrent, config.kv_elem);
            let budget = EngineConfig { max_context: None, kv_budget_bytes: 100 * per_position * max_batch, ..config };
            assert_eq!(Plan::new(&recurrent, &budget).unwrap().cache.positions, 100);
            let functions = r.functions();
            assert!(functions.contains(&Function::CopyState) && functions.contains(&verify[0]), "{functions:?}");
            assert!(!functions.iter().any(|f| matches!(f, Function::Decode { rows, .. } if *rows > max_batch)));
        }
        let no_drafts = Plan::new(&recurrent, &config(2, Some(300))).unwrap();
        assert_eq!((no_drafts.scratch, no_drafts.cache.slots), (None, 2));
        let err = Plan::new(&recurrent, &EngineConfig { device: "cuda".into(), ..drafts(4) }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "speculative decoding (--draft) of a model with recurrent layers (qwen3_5) keeps its state from before each check in a spare slot, which cuda (sm_80) does not copy between slots; use a CPU device"
        );
    }
}
