#!/usr/bin/env bash
# stage-variants.sh [NAME...]: builds release `gpumalloc` binaries of this
# tree with different build-time settings of the device heap and copies each
# to $DEST/<name>/ (default .gpu-var, git-ignored) for
# scripts/bench-compare.sh. With HEAP_WHOLE=1 it also copies each build's
# tests/gpu_heap_whole.rs and tests/gpu.rs binaries (test-gpu_heap_whole,
# test-gpu); with PTXAS=path it prints each build's
# registers (scripts/ptxas-report.sh over the PTX that build embeds).
#
# Variants (issue 12's speed work; predictions in docs/PERF.md):
#   pre-s24        the defaults before 2026-11-22's second session (no
#                  shared whole-segment slot budget, no large-heap rule):
#                  what `auto` was for every variant below except wshare5f2
#   auto           the defaults of this tree (= wshare5f2 since then): each heap's segment size from
#                  its size (at least 2048 segments: 8 MiB for bench's 16 GiB
#                  heaps, 4 MiB for the 8.4 GiB demand + 3% heap, 2 MiB for
#                  256 MiB), spare segments for whole-segment classes within
#                  1/8 of the heap (= m2048s3)
#   s21            every heap 2 MiB segments (GPUMALLOC_SEGMENT_SHIFT=21, the
#                  geometry of main before heap-shift)
#   s24            every heap 16 MiB segments (GPUMALLOC_SEGMENT_SHIFT=24)
#   m1024s6        the default before m2048s3: at least 1024 segments (16 GiB:
#                  16 MiB segments; 8 GiB: 8 MiB), spare segments for
#                  whole-segment classes within 1/64 of the heap (none below
#                  8192 segments)
#   spare3         at least 1024 segments, whole-segment spares within 1/8
#                  (the `spare3` of docs/results/h100-issue12-shift/, run
#                  against the 1024 / 1/64 default; = m1024s3)
#   m2048s3        at least 2048 segments, spares within 1/8 (= auto now)
#   m2048s3b6      m2048s3 with slot blocks within 1/64 of the heap instead of
#                  1/256 (GPUMALLOC_SLOT_BUDGET_SHIFT=6): 2 and 4 KiB get 32 slots
#                  on a 16 GiB heap instead of 8 (issue 12: 2 KiB is +12%)
#   fmt2           the defaults, but a slot installer formats a segment
#                  without the class's lock once it takes a quarter of it
#                  (GPUMALLOC_UNLOCKED_FORMAT_SHIFT=2; the default is half):
#                  128 B 36% faster than be7ddc7 on the H100, but the 256 MiB
#                  heap only 86.7% used at the first null (issue 12 wants 90%)
#   w6             the defaults, with slot blocks of classes whose block fills
#                  a segment within 1/64 of the heap
#                  (GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT=6): 2 and 4 KiB get 32
#                  slots on a 16 GiB heap (8 MiB segments) instead of 8,
#                  every other class as in auto
#   wshare5        slot blocks of all classes whose block fills a segment,
#                  together, within 1/32 of the heap
#                  (GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=5): 2 and 4 KiB 32 slots
#                  on the 16 GiB bench heap (as w6), 16 for 1/2/4 KiB on the
#                  8.4 GiB demand + 3% heap (w6: 32, auto: 8), 1 on 256 MiB
#                  (as auto). Predicted: 2/4 KiB as w6 (-35..-40%), 1 KiB as
#                  auto (+6..8%, still over 5%), 256 MiB rounds as auto
#                  (90.8-91.5%), demand + 3% about 97.9% (auto 98.9%)
#   big34          heaps of 16 GiB and more budget every slice class's slot
#                  blocks at 1/64 of the heap (GPUMALLOC_LARGE_HEAP_SHIFT=34):
#                  1, 2 and 4 KiB get 32 slots on the bench heap (auto: 16,
#                  8, 8); smaller heaps exactly as auto. Predicted: 1 KiB
#                  -0..-10%, 2/4 KiB -35..-40%, mixed about -10%, the
#                  utilization workloads as auto (their heaps are < 16 GiB)
#   big34f2        big34, and on those heaps the quarter rule for unlocked
#                  formats (GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=2):
#                  predicted as big34 plus 128 B -30..-36% (fmt2's gain), the
#                  utilization workloads as auto
#   wshare5f2      (the defaults now) wshare5's slot budget everywhere, and big34f2's quarter
#                  rule for unlocked formats on heaps of 16 GiB and more
#                  (GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT=0 keeps big34's
#                  slot budget off): on the H100 wshare5 met issue 12's
#                  utilization floors with 2/4 KiB -38..-40% and 128 B at
#                  +5%, and big34f2 took 128 B to -32%; predicted: both
#                  gains, utilization as wshare5 (its heaps are < 16 GiB)
#   m4096s3        at least 4096 segments (8 GiB: 2 MiB; 16 GiB: 4 MiB),
#                  spares within 1/8
#   claim          the defaults (the name of the earlier run, = auto)
#   claim-b2       + launch bounds: two 256-thread blocks of heap_alloc per SM
#   claim-slots128 + 128 slots per class, slot blocks within 1/64 of the heap
#   claim-s24      + 16 MiB segments (= s24)
#   spb13-sp1-w4   8192 slices a block (GPUMALLOC_SLICES_PER_BLOCK_SHIFT=13),
#                  one spare a slot, the whole-segment slot share doubled
#                  (1 KiB joins those classes): issue 15, "Larger slice
#                  blocks" in docs/PERF.md
#   spb13-w4       the same with three spares
#   spb14-sp1-w4   16384 slices a block, one spare, share doubled
#   f3, f5         on heaps of 16 GiB and more, slot installers format a
#                  segment without the class's lock when they take 1/8
#                  (f3) or 1/32 (f5) of its blocks (the default is 1/4):
#                  the wide 64 B (f3) and 16-64 B (f5) classes' claims of two
#                  blocks then format unlocked (f3 on the H100, 2026-11-24:
#                  64 B -24%, but its span 3.9 and mixed +14%; not kept)
#   f0, f1         the other way: on heaps of 16 GiB and more, only claims
#                  that take a whole segment (f0) or half of one (f1)
#                  format without the lock, so 128 B (f1) and 128-256 B
#                  (f0) format locked batches, which cover a claim of
#                  every slot since the tenth session
#   b7             every slice class's slot budget doubled
#                  (GPUMALLOC_SLOT_BUDGET_SHIFT=7; on the bench heap only
#                  1 KiB moves, 16 -> 32 slots)
#   ws4            the whole-segment classes' slot share doubled
#                  (GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=4): 32 slots for 2 KiB
#                  and up on the bench heap, on every heap size;
#                  ws6, ws7: halved and quartered (=6, =7), fewer slot
#                  blocks held half-issued at a mixed burst's peak
#   wsalt          claims of whole segments spread a lost race's retry over
#                  the tree word (GPUMALLOC_WHOLE_CLAIM_SALT=1; measured with
#                  the block class of one segment spread too, 17% slower
#                  there; since then slice classes only; not the default:
#                  mixed -20% but its span wider)
#   wnear          a lost race's retry aims 0-3 claims' width above the
#                  lowest ids (GPUMALLOC_WHOLE_CLAIM_SALT=2: the default
#                  since 2026-11-24)
#   wlow           whole-segment claims aim at the lowest ids on every try
#                  (GPUMALLOC_WHOLE_CLAIM_SALT=0: the default before; with
#                  the wide blocks, the allocator of commit 28e09c7)
#   s33            the allocator of 2026-11-23's eighth session (narrow and
#                  wlow together: its PTX but for the layout fingerprint)
#   narrow         the geometry before 2026-11-24: 4096 slices a block and
#                  three spares for every class (the default since then is
#                  wide7's)
#   wide6          8192 slices a block and one spare a slot for the 16, 32
#                  and 64 B classes only (GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT=6,
#                  GPUMALLOC_WIDE_SPARES=1); every other class as the default
#   wide7          the same up to 128 B (the default since 2026-11-24)
#   wide6s3        wide6 with three spares
#   split          issue 15's registers (branch `regs`): cold paths cut so
#                  that ptxas allocates each function of heap_alloc's graph
#                  alone (GPUMALLOC_SPLIT_COLD=1): 98 registers on sm_90
#                  (162 before), no spills, no stack on the fast path;
#                  the default from 2026-11-23's eighth session to
#                  2026-11-24's fourteenth (also named split1)
#   unsplit        the code shape before that (GPUMALLOC_SPLIT_COLD=0): 162
#                  registers on sm_90, one 256-thread block per SM
#   split-b3       split + launch bounds for three 256-thread blocks per SM
#                  (80 registers; 20-24 B of spills at the kernel's entry
#                  and exit)
#   (split-tail, split64, split80: GPUMALLOC_SPLIT_COLD=2, only a slice's
#                  first step inline; measured 25-72% slower at slice sizes
#                  on 2026-11-23 and removed; docs/PERF.md, "heap_alloc in
#                  64 registers")
#   split3         split, and heap_alloc's own code cut to a slice
#                  allocation's loop at its home slot with the wait past a
#                  block's end inline; only the installing leader's install
#                  is called by the ABI, the stealing pass, block classes
#                  and runs in one out-of-line call in tail position
#                  (GPUMALLOC_SPLIT_COLD=3; branch `regs3`): sm_90 86
#                  registers, sm_80 121, no spills
#   split3-64      split3 + launch bounds for four 256-thread blocks per
#                  SM (GPUMALLOC_ALLOC_BLOCKS_PER_SM=4): 64 registers on
#                  sm_80 and sm_90, spills only inside the cold callees;
#                  waiting teams make no call and touch no local memory;
#                  the default since 2026-11-24's fourteenth session (=
#                  auto; every variant above but split, unsplit, split-b3
#                  and split3 builds this shape, with the setting it names)
#   sadd           slice classes reserve blocks with one subtract, as block
#                  classes do (GPUMALLOC_SLICE_CLAIM_ADD=1, the default
#                  since 2026-11-23's sixth session: docs/PERF.md, "16 B's
#                  fixed cost")
#   scas           the slices' CAS reservation before that
#                  (GPUMALLOC_SLICE_CLAIM_ADD=0)
#   sp1, sp2       one or two spare blocks per slot instead of three
#                  (GPUMALLOC_SPARES): span against speed (docs/PERF.md,
#                  "Where slice allocation waits"; the `refill` variant
#                  measured there was removed: its diff is in
#                  docs/results/h100-s31/refill-spares/)
#   sp5            five spare blocks per slot (GPUMALLOC_SPARES=5)
#   slots64        64 slots per slice class where the budget allows
#                  (GPUMALLOC_SLOTS=64; 32 is the default)
#   cf0, cf1, cf2  counted formats (GPUMALLOC_COUNTED_FORMAT): none, the
#                  rules before 2026-11-24's eleventh session (=0); the
#                  slice classes that formatted unlocked (=1); every slice
#                  class whose claim takes less than a segment (=2, the
#                  default)
#   bo2            waiters sleep at most 128 ns instead of 512
#                  (GPUMALLOC_BACKOFF_MAX_DOUBLINGS=2)
#   iclock         counts installs and team waits in SM cycles
#                  (GPUMALLOC_INSTALL_CLOCK=1; `bench frag` prints them);
#                  iclock2 times installs until the block is in hand,
#                  iclock3 the leader's whole call (=2, =3);
#                  iclockN-cK: iclockN counting only slice class K
#                  (GPUMALLOC_INSTALL_CLOCK_CLASS; 0 = 16 B … 8 = 4 KiB);
#                  sp2-iclock2, sp5-iclock2: iclock2 with 2 or 5 spares;
#                  m4096s3-iclock2: iclock2 on m4096s3's geometry
#   run1, run2, run4  a claim's adjacent whole segments installed as one
#                  slot run of up to 1, 2 or 4 blocks instead of parked as
#                  spares (GPUMALLOC_SLOT_RUN; slot.rs; 4 is the default
#                  since 2026-11-24's twelfth session, run1 the rule before)
#   segrun         runs of whole segments only, not of blocks inside a
#                  segment (GPUMALLOC_SLOT_RUN_BLOCKS=0: the default of
#                  68aebd3); blkrun2: runs of any claim's blocks (=2);
#                  blkrun1: only of claims that formatted their segment
#                  (=1, the rule before 2026-11-24's thirteenth session);
#                  blkrun3: also a reserved claim's blocks taken at their
#                  ticket bits with one RMW (=3, the default)
#   segruns        a claim of a class with a few blocks per segment takes
#                  whole adjacent segments as one run (GPUMALLOC_SEGMENT_RUNS=1);
#                  segruns2: one segment by that path (=2); segruns3: that
#                  segment from the top of the lowest tree word (=3);
#                  segruns4: as segruns3 once a whole-segment class has
#                  claimed on the heap, as segruns2 before (=4, the default
#                  since 2026-11-24's fifteenth session); segruns0: the
#                  class tree's claim, the default before
#   b6             heap_alloc with launch bounds of six blocks per SM (40
#                  registers: no spill on sm_90, spills on sm_80)
#   free8          heap_free with launch bounds of eight 256-thread blocks
#                  per SM (32 registers; GPUMALLOC_FREE_BLOCKS_PER_SM=8, the
#                  default since 2026-11-24's fifteenth session); free0: none
#                  (35 registers on sm_80, 39 on sm_90: the shape before)
#   adj            whole-segment claims aim at adjacent free ids first
#                  (GPUMALLOC_WHOLE_CLAIM_ADJACENT=1)
#   s15            32 KiB a slice class (GPUMALLOC_MAX_SLICE_SHIFT=15, the
#                  default since 2026-11-24's sixteenth session; the smallest
#                  block class 64 KiB); s14: the geometry before, 32 KiB a
#                  block class. (That session's first `s15` still counted
#                  32 KiB in the whole-segment share, which gave 2-32 KiB 8
#                  slots on the bench heap, and `s15+ws4` doubled the share
#                  back to 16; 32 KiB is no longer counted, so s15 was auto
#                  until auto became s17.)
#   s16, s17       64 KiB, and 64 and 128 KiB, slice classes too
#                  (GPUMALLOC_MAX_SLICE_SHIFT=16, 17; the smallest block
#                  class then 128 / 256 KiB, 16 / 8 blocks to a 2 MiB
#                  segment)
#   stripe0        no class stripes (GPUMALLOC_STRIPE=0,
#                  `gpu-kernel/src/stripe.rs`): every slot install claims
#                  its blocks; stripe1 the classes whose segment holds 8
#                  to 32 blocks and that are not wide (256 B on the bench
#                  heap) draw from a stripe; stripe2 (the default) those
#                  and the wide ones (32 B ... 256 B); stripe3 every slice
#                  class;
#                  sb8, sb16, sb32, sb48: stripes of 8, 16, 32 or 48 blocks
#                  (GPUMALLOC_STRIPE_BLOCKS; 48 unless set, 64 before the
#                  twenty-first session), with a stripe
#                  variant (stripe1+sb16);
#                  reuse0: refills take whole free segments only, not the
#                  free blocks of a segment a block still holds
#                  (GPUMALLOC_STRIPE_REUSE=0, the rule before the
#                  twenty-second session)
#   dcK            claims sized by the demand waiting on the slot: at
#                  most the blocks that K times the slices reserved past
#                  the replaced version's end fill (GPUMALLOC_DEMAND_CLAIM=K,
#                  team.rs; 8 is the default since the twenty-third
#                  session); K = 0 (off, the rule before), 1, 2, 4, 8, 16,
#                  32, 128. (That session's first dc4 and dc16 multiplied
#                  after rounding up, and claimed in full.)
#   A+B            the settings of A and of B (blkrun3+iclock2-c4)
#
# One target directory serves every variant: build.rs reruns the PTX build
# when a setting changes, and cargo tracks the `option_env!` reads.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.gpu-var}

settings() {
  # A name joined with "+" builds with the settings of each part.
  if [[ $1 == *+* ]]; then
    local part all=""
    for part in ${1//+/ }; do all="$all $(settings "$part")"; done
    echo "$all"
    return
  fi
  case $1 in
    claim | auto) echo "" ;;
    s21) echo "GPUMALLOC_SEGMENT_SHIFT=21" ;;
    s24) echo "GPUMALLOC_SEGMENT_SHIFT=24" ;;
    m1024s6) echo "GPUMALLOC_AUTO_MIN_SEGMENTS=1024 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=6" ;;
    spare3 | m1024s3)
      echo "GPUMALLOC_AUTO_MIN_SEGMENTS=1024 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=3" ;;
    m2048s3) echo "GPUMALLOC_AUTO_MIN_SEGMENTS=2048 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=3" ;;
    m2048s3b6) echo "GPUMALLOC_AUTO_MIN_SEGMENTS=2048 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=3 GPUMALLOC_SLOT_BUDGET_SHIFT=6" ;;
    fmt2) echo "GPUMALLOC_UNLOCKED_FORMAT_SHIFT=2" ;;
    w6) echo "GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT=6" ;;
    pre-s24) echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=0 GPUMALLOC_LARGE_HEAP_SHIFT=0" ;;
    wshare5) echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=5 GPUMALLOC_LARGE_HEAP_SHIFT=0" ;;
    big34)
      echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=0 GPUMALLOC_LARGE_HEAP_SHIFT=34 GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT=6 GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=1" ;;
    big34f2)
      echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=0 GPUMALLOC_LARGE_HEAP_SHIFT=34 GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT=6 GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=2" ;;
    wshare5f2) echo "" ;;
    m4096s3) echo "GPUMALLOC_AUTO_MIN_SEGMENTS=4096 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=3" ;;
    claim-b2) echo "GPUMALLOC_ALLOC_BLOCKS_PER_SM=2" ;;
    claim-slots128)
      echo "GPUMALLOC_SLOTS=128 GPUMALLOC_SLOT_BUDGET_SHIFT=6 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=4" ;;
    claim-s24) echo "GPUMALLOC_SEGMENT_SHIFT=24" ;;
    split | split1) echo "GPUMALLOC_SPLIT_COLD=1 GPUMALLOC_ALLOC_BLOCKS_PER_SM=0" ;;
    unsplit) echo "GPUMALLOC_SPLIT_COLD=0 GPUMALLOC_ALLOC_BLOCKS_PER_SM=0" ;;
    split-b3) echo "GPUMALLOC_SPLIT_COLD=1 GPUMALLOC_ALLOC_BLOCKS_PER_SM=3" ;;
    split3) echo "GPUMALLOC_SPLIT_COLD=3 GPUMALLOC_ALLOC_BLOCKS_PER_SM=0" ;;
    split3-64) echo "GPUMALLOC_SPLIT_COLD=3 GPUMALLOC_ALLOC_BLOCKS_PER_SM=4" ;;
    b6) echo "GPUMALLOC_ALLOC_BLOCKS_PER_SM=6" ;;
    sadd) echo "GPUMALLOC_SLICE_CLAIM_ADD=1" ;;
    scas) echo "GPUMALLOC_SLICE_CLAIM_ADD=0" ;;
    sp1) echo "GPUMALLOC_SPARES=1" ;;
    sp2) echo "GPUMALLOC_SPARES=2" ;;
    sp5) echo "GPUMALLOC_SPARES=5" ;;
    slots64) echo "GPUMALLOC_SLOTS=64" ;;
    bo2) echo "GPUMALLOC_BACKOFF_MAX_DOUBLINGS=2" ;;
    iclock) echo "GPUMALLOC_INSTALL_CLOCK=1" ;;
    iclock2) echo "GPUMALLOC_INSTALL_CLOCK=2" ;;
    iclock3) echo "GPUMALLOC_INSTALL_CLOCK=3" ;;
    iclock[123]-c[0-9]) echo "GPUMALLOC_INSTALL_CLOCK=${1:6:1} GPUMALLOC_INSTALL_CLOCK_CLASS=${1:9}" ;;
    sp5-iclock2) echo "GPUMALLOC_SPARES=5 GPUMALLOC_INSTALL_CLOCK=2" ;;
    sp2-iclock2) echo "GPUMALLOC_SPARES=2 GPUMALLOC_INSTALL_CLOCK=2" ;;
    m4096s3-iclock2) echo "GPUMALLOC_AUTO_MIN_SEGMENTS=4096 GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT=3 GPUMALLOC_INSTALL_CLOCK=2" ;;
    spb13-sp1-w4) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=13 GPUMALLOC_SPARES=1 GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=4" ;;
    spb13-w4) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=13 GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=4" ;;
    spb14-sp1-w4) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=14 GPUMALLOC_SPARES=1 GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=4" ;;
    f0) echo "GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=0" ;;
    f1) echo "GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=1" ;;
    f3) echo "GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=3" ;;
    f5) echo "GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT=5" ;;
    ws4) echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=4" ;;
    ws6) echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=6" ;;
    dc0) echo "GPUMALLOC_DEMAND_CLAIM=0" ;;
    dc1) echo "GPUMALLOC_DEMAND_CLAIM=1" ;;
    dc2) echo "GPUMALLOC_DEMAND_CLAIM=2" ;;
    dc4) echo "GPUMALLOC_DEMAND_CLAIM=4" ;;
    dc16) echo "GPUMALLOC_DEMAND_CLAIM=16" ;;
    dc8) echo "GPUMALLOC_DEMAND_CLAIM=8" ;;
    dc32) echo "GPUMALLOC_DEMAND_CLAIM=32" ;;
    dc128) echo "GPUMALLOC_DEMAND_CLAIM=128" ;;
    ws7) echo "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT=7" ;;
    b7) echo "GPUMALLOC_SLOT_BUDGET_SHIFT=7" ;;
    cf0) echo "GPUMALLOC_COUNTED_FORMAT=0" ;;
    cf1) echo "GPUMALLOC_COUNTED_FORMAT=1" ;;
    cf2) echo "GPUMALLOC_COUNTED_FORMAT=2" ;;
    fis0) echo "GPUMALLOC_FIRST_INSTALL_SPARES=0" ;;
    run1) echo "GPUMALLOC_SLOT_RUN=1" ;;
    run2) echo "GPUMALLOC_SLOT_RUN=2" ;;
    run4) echo "GPUMALLOC_SLOT_RUN=4" ;;
    segrun) echo "GPUMALLOC_SLOT_RUN_BLOCKS=0" ;;
    blkrun2) echo "GPUMALLOC_SLOT_RUN_BLOCKS=2" ;;
    blkrun1) echo "GPUMALLOC_SLOT_RUN_BLOCKS=1" ;;
    blkrun3) echo "GPUMALLOC_SLOT_RUN_BLOCKS=3" ;;
    segruns) echo "GPUMALLOC_SEGMENT_RUNS=1" ;;
    segruns2) echo "GPUMALLOC_SEGMENT_RUNS=2" ;;
    segruns3) echo "GPUMALLOC_SEGMENT_RUNS=3" ;;
    segruns4) echo "GPUMALLOC_SEGMENT_RUNS=4" ;;
    segruns0) echo "GPUMALLOC_SEGMENT_RUNS=0" ;;
    free8) echo "GPUMALLOC_FREE_BLOCKS_PER_SM=8" ;;
    free0) echo "GPUMALLOC_FREE_BLOCKS_PER_SM=0" ;;
    adj) echo "GPUMALLOC_WHOLE_CLAIM_ADJACENT=1" ;;
    s15) echo "GPUMALLOC_MAX_SLICE_SHIFT=15" ;;
    s14) echo "GPUMALLOC_MAX_SLICE_SHIFT=14" ;;
    s16) echo "GPUMALLOC_MAX_SLICE_SHIFT=16" ;;
    s17) echo "GPUMALLOC_MAX_SLICE_SHIFT=17" ;;
    fis2) echo "GPUMALLOC_FIRST_INSTALL_SPARES=2" ;;
    wsalt) echo "GPUMALLOC_WHOLE_CLAIM_SALT=1" ;;
    wlow) echo "GPUMALLOC_WHOLE_CLAIM_SALT=0" ;;
    wnear) echo "GPUMALLOC_WHOLE_CLAIM_SALT=2" ;;
    s33) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=12 GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT=14 GPUMALLOC_WIDE_SPARES=3 GPUMALLOC_WHOLE_CLAIM_SALT=0" ;;
    narrow) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=12 GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT=14 GPUMALLOC_WIDE_SPARES=3" ;;
    stripe0) echo "GPUMALLOC_STRIPE=0" ;;
    stripe1) echo "GPUMALLOC_STRIPE=1" ;;
    stripe2) echo "GPUMALLOC_STRIPE=2" ;;
    stripe3) echo "GPUMALLOC_STRIPE=3" ;;
    sb8) echo "GPUMALLOC_STRIPE_BLOCKS=8" ;;
    sb16) echo "GPUMALLOC_STRIPE_BLOCKS=16" ;;
    sb32) echo "GPUMALLOC_STRIPE_BLOCKS=32" ;;
    sb48) echo "GPUMALLOC_STRIPE_BLOCKS=48" ;;
    reuse0) echo "GPUMALLOC_STRIPE_REUSE=0" ;;
    wide6) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=13 GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT=6 GPUMALLOC_WIDE_SPARES=1" ;;
    wide7) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=13 GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT=7 GPUMALLOC_WIDE_SPARES=1" ;;
    wide6s3) echo "GPUMALLOC_SLICES_PER_BLOCK_SHIFT=13 GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT=6" ;;
    *) echo "unknown variant $1" >&2; exit 1 ;;
  esac
}

for name in "${@:-auto s21 s24}"; do
  for v in $name; do
    set_env=$(settings "$v")
    echo "== $v: ${set_env:-defaults}"
    # shellcheck disable=SC2086 # one word per setting
    env $set_env cargo build --release --bin gpumalloc
    mkdir -p "$DEST/$v"
    cp target/release/gpumalloc "$DEST/$v/"
    if [ -n "${PTXAS:-}" ]; then
      # The PTX this build embedded: build.rs's bounded copy if it is newer.
      ptx=$(ls -t target/release/build/gpumalloc-*/out/gpu_kernels.ptx \
              target/release/build/gpumalloc-*/out/ptx-target/nvptx64-nvidia-cuda/release/gpu_kernels.ptx \
              2>/dev/null | head -1 || true)
      scripts/ptxas-report.sh "$PTXAS" "$ptx" | grep -E -- '--|heap_alloc|heap_free|error' \
        | tee "$DEST/$v/ptxas.txt" || true
    fi
    if [ -n "${HEAP_WHOLE:-}" ]; then
      for test in gpu_heap_whole gpu; do
        # shellcheck disable=SC2086
        bin=$(env $set_env cargo test --release -p gpumalloc --no-run --test $test \
                --message-format=json 2>/dev/null | TEST=$test python3 -c 'import json,os,sys
for l in sys.stdin:
    m=json.loads(l)
    if (m.get("reason")=="compiler-artifact" and m.get("executable")
            and m["target"]["kind"]==["test"] and m["target"]["name"]==os.environ["TEST"]):
        print(m["executable"])' | tail -1)
        if [ -z "$bin" ]; then echo "no $test test binary for $v" >&2; exit 1; fi
        cp "$bin" "$DEST/$v/test-$test"
      done
    fi
  done
done
du -sh "$DEST"/*
