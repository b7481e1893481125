//! The rules this project adds to the published policies (none is in the
//! Coop, DTR or DTE papers), in one place: Coop has them on by default (but
//! `order_inputs`, `compact_dividers` and `move_small_in_windows`), Coop-G
//! and the paper's Coop off, DTR and DTE off and on
//! only for the ablations (`compare`), so that each rule's effect can be
//! measured on every policy alike. Plain data, copied into each policy;
//! the executor reads it through `EvictionPolicy::rules`.

/// Which of the added rules a policy follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddedRules {
    /// A tensor the program had dropped, recomputed as an input of a
    /// recomputation, is freed again as soon as the recomputations that
    /// hold it are done (the program's drop applied again), instead of
    /// staying resident until it is evicted.
    pub drop_dead_inputs: bool,
    /// When an op's output fits nowhere, the executor tries once more with
    /// the op's movable inputs (resident, unpinned, held by that op alone)
    /// moved and placed with the output as one request
    /// (`Executor::compute_beside_inputs`), instead of running out of memory.
    pub relocate_inputs: bool,
    /// When a tensor still fits nowhere (after any moves of
    /// `relocate_inputs`), the executor tries once more with every tensor
    /// that the op and its recomputation chain hold (resident, unpinned,
    /// locked), and if need be one pinned tensor that splits a run, moved
    /// and placed with it as one request (`executor/held.rs`), instead of
    /// running out of memory.
    pub move_held_tensors: bool,
    /// An unevictable request that fits a free block goes to the shortest
    /// run between pinned tensors that has one (`super::short_gap`) instead
    /// of first-fit or Coop's partitioning.
    pub pinned_in_short_gaps: bool,
    /// An op, or a recomputation, brings back its inputs in `chain_order`'s
    /// order (resident ones locked first, then the missing ones whose
    /// recomputation holds the most bytes beyond their own first) instead
    /// of in the order recorded.
    pub order_inputs: bool,
    /// A tensor on a dropped chain (`dropped_chain`: its recomputation would
    /// run through tensors the program drops as it goes, a gradient in the
    /// backward pass) is never evicted.
    pub keep_dropped_chains: bool,
    /// An op's outputs other than its largest (its *side outputs*:
    /// BatchNorm's and LayerNorm's saved statistics) go into the smallest
    /// free block that holds them (`Pool::best_fit`) instead of where the
    /// policy puts a new tensor, so that one does not sit at the start of
    /// the block the op's main output takes and, outliving it, divide two
    /// later holes; when no free block holds it, the policy's search as
    /// before (`Executor::allocate`). On in Coop since the seventeenth
    /// session, with `borrow_live_inputs` (alone it moves Swin-T's minimum
    /// budgets and overhead the wrong way; together they keep both
    /// minimums of the transformer traces 20% below DTR's):
    /// `--side-ablation`, `docs/PERF.md` "Where the vision models' free
    /// space lies" and "Side outputs best-fit and live inputs borrowed,
    /// together".
    pub side_outputs_best_fit: bool,
    /// Before the policy evicts for a request that fits no free block, the
    /// groups of tensors that alone divide a run of free blocks long enough
    /// for it (resident, unpinned, unlocked, fewer bytes than the free block
    /// on either side) are moved to the smallest free blocks outside the run,
    /// each charged as a move (a device copy on a recorded trace), and the
    /// request goes into the
    /// joined block (`executor/compact.rs`). Off in every policy: it moves
    /// Swin-T's minimum budget from 0.252 to 0.270 (`--compact-ablation`,
    /// `docs/PERF.md` "Small tensors moved so holes join").
    pub compact_dividers: bool,
    /// In Coop's window search, a tensor whose bytes are under
    /// 1/`MOVE_FRACTION` of the request's and whose op's cost is below its
    /// eviction score is scored at that cost and, if its window is taken,
    /// moved out of the window (to the smallest free block outside it that
    /// holds it, charged as a move: a device copy on a recorded trace;
    /// evicted when none does) instead of evicted; with
    /// `keep_dropped_chains`, a tensor on a dropped
    /// chain smaller than the request and than the items on either side is
    /// scored so too instead of blocking the window (`Coop::search`,
    /// `Executor::move_out_of`). Off in every policy: it moves ResNet-50's
    /// minimum budget from 0.293 to 0.302 and Swin-T's to 0.270.
    pub move_small_in_windows: bool,
    /// A tensor's prices leave out its inputs that a policy evicted and the
    /// program still holds (`TensorTable::borrow_live_inputs`): the
    /// projected cost the evicted classes reached only through them, the
    /// recompute peak their bytes. The program reads such an input again,
    /// so it comes back with its chain whether or not its consumer is
    /// evicted; recomputing the consumer only brings it back early. On in
    /// Coop since the seventeenth session, with `side_outputs_best_fit`
    /// (alone it puts Coop's overhead at or below DTR's and DTE's at every
    /// ratio of the four traces but moves Swin-T's minimum budgets to 19%
    /// and 20% below DTR's): `--borrow-ablation`, `docs/PERF.md` "Coop's
    /// recompute peak without the live inputs it would bring back anyway"
    /// and "Side outputs best-fit and live inputs borrowed, together".
    pub borrow_live_inputs: bool,
    /// When a request fits no free block but the pool's free bytes would
    /// hold it, the executor first looks for the window of whole intervals
    /// that holds it with the fewest bytes of tensors in it (resident,
    /// unpinned, unlocked; free space counts nothing), moves those tensors
    /// out, largest first, each into the smallest free block outside the
    /// window, charged as moves (device copies on a recorded trace), and
    /// places the request there (`executor/moves.rs`); when one of them
    /// finds no block, nothing moves and the policy evicts as before. What
    /// it saves: an eviction in a pool whose free bytes are enough but in
    /// holes (without it, on Swin-T at 0.45, Coop evicts a 294 MiB tensor
    /// for a 294 MiB request while 669 MiB lie free in five holes of
    /// 37–267 MiB). On in Coop since the eighteenth session:
    /// `--moves-ablation`, `docs/PERF.md` "Holes joined by moves".
    pub join_holes_by_moves: bool,
}

impl AddedRules {
    /// No added rule: the published policies.
    pub const NONE: AddedRules = AddedRules {
        drop_dead_inputs: false,
        relocate_inputs: false,
        move_held_tensors: false,
        pinned_in_short_gaps: false,
        order_inputs: false,
        keep_dropped_chains: false,
        side_outputs_best_fit: false,
        compact_dividers: false,
        move_small_in_windows: false,
        borrow_live_inputs: false,
        join_holes_by_moves: false,
    };

    /// Coop's defaults: every rule but `order_inputs`, `compact_dividers`
    /// and `move_small_in_windows`; `order_inputs` is off since the merge
    /// with the held-tensor move (with both chain rules on, Swin-T's
    /// minimum budget rose from 0.257 to 0.266; `--chain-ablation`).
    pub const COOP: AddedRules = AddedRules {
        drop_dead_inputs: true,
        relocate_inputs: true,
        move_held_tensors: true,
        pinned_in_short_gaps: true,
        order_inputs: false,
        keep_dropped_chains: true,
        side_outputs_best_fit: true,
        compact_dividers: false,
        move_small_in_windows: false,
        borrow_live_inputs: true,
        join_holes_by_moves: true,
    };
}
