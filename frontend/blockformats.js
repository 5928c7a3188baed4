// The block formats of the precision panel: what quantizing each tensor of the
// layer to a block-scaled format (MXFP8, MXFP6, MXFP4, NVFP4) does to it, as
// /step serves it per tensor: `block_headroom` (the shares and the server's
// verdict whether the tensor survives the format) beside the record's counts
// (`precision.block_formats`). This module words them and computes no share.
// No DOM: runs under `node --test`.

/** The block formats, in the record's order (docs/FORMAT.md, layout 12). */
export const BLOCK_FORMATS = ['mxfp8_e4m3', 'mxfp8_e5m2', 'mxfp6_e2m3', 'mxfp6_e3m2', 'mxfp4_e2m1', 'nvfp4'];
export const BLOCK_FORMAT_NAMES = {
  mxfp8_e4m3: 'MXFP8 E4M3', mxfp8_e5m2: 'MXFP8 E5M2', mxfp6_e2m3: 'MXFP6 E2M3', mxfp6_e3m2: 'MXFP6 E3M2',
  mxfp4_e2m1: 'MXFP4 E2M1', nvfp4: 'NVFP4',
};
/** Values per block: OCP MX blocks of 32, NVFP4 blocks of 16. */
export const BLOCK_SIZES = {mxfp8_e4m3: 32, mxfp8_e5m2: 32, mxfp6_e2m3: 32, mxfp6_e3m2: 32, mxfp4_e2m1: 32, nvfp4: 16};

// The lines of a cell, top to bottom: what each share is, as the panel's hint explains it.
const LINES = [
  ['to_zero', '0'],
  ['subnormal', 'sub'],
  ['saturated', 'sat'],
  ['wide_blocks', 'wide'],
];

/** A served share as the panel writes it: "0", "<0.1%", "12.5%"; "–" for null (nothing to divide). */
export function shareText(share) {
  if (share === null || share === undefined || !Number.isFinite(share)) return '–';
  if (share === 0) return '0';
  const percent = 100 * share;
  return percent < 0.1 ? '<0.1%' : `${percent.toFixed(1)}%`;
}

/** A relative squared error as the panel writes it: "0", or two digits as "2.5e-4". */
export function errorText(error) {
  if (error === null || error === undefined || !Number.isFinite(error)) return '–';
  return error === 0 ? '0' : error.toExponential(1).replace('e+', 'e');
}

/** What a served verdict says: "survives", "fails", or "–" without a finite non-zero value. */
export function survivalText(survives) {
  if (survives === true) return 'survives';
  if (survives === false) return 'fails';
  return '–';
}

/** Whether a layer's /step entry has the block part for at least one of its tensors. */
export function hasBlockPart(layerSnapshot) {
  return Object.values(layerSnapshot?.tensors ?? {}).some((entry) => entry.block_headroom);
}

/**
 * The rows of the block table, one per tensor of the layer whose precision
 * record has the block part, in /step's order:
 * `{tensor, role, total, cells: {format: {survives, verdict, lines: [{share, text}], title}}}`.
 * `lines` are the cell's lines (to zero, subnormal, saturated, wide blocks, the error, and
 * the blocks holding NaN or Inf when there are some), `title` its hover with the counts.
 */
export function blockRows(layerSnapshot) {
  const rows = [];
  for (const [tensor, entry] of Object.entries(layerSnapshot?.tensors ?? {})) {
    const served = entry.block_headroom;
    const counts = entry.precision?.block_formats;
    if (!served || !counts) continue;
    const total = entry.precision.finite_nonzero;
    const cells = {};
    for (const format of BLOCK_FORMATS) {
      const shares = served[format];
      const count = counts[format];
      const lines = LINES.map(([share, label]) => ({share, text: `${label}: ${shareText(shares[share])}`}));
      lines.push({share: 'relative_error', text: `err: ${errorText(shares.relative_error)}`});
      if (count.nonfinite_blocks > 0) {
        lines.push({share: 'nonfinite_blocks', text: `NaN/Inf blocks: ${count.nonfinite_blocks}`});
      }
      cells[format] = {
        survives: shares.survives, verdict: survivalText(shares.survives), lines,
        title: cellTitle(tensor, format, total, count),
      };
    }
    rows.push({tensor, role: entry.role, total, cells});
  }
  return rows;
}

/** A cell's hover: the format, and the record's counts behind each share. */
function cellTitle(tensor, format, total, count) {
  const name = `${BLOCK_FORMAT_NAMES[format]} (blocks of ${BLOCK_SIZES[format]}), ${tensor}`;
  return `${name}: of ${total} finite non-zero values, ${count.to_zero} become zero, `
    + `${count.subnormal} subnormal, ${count.saturated} saturate; ${count.wide_blocks} of `
    + `${count.blocks} blocks are wider than the element's range`
    + (count.nonfinite_blocks ? `, ${count.nonfinite_blocks} hold NaN or Inf (not counted)` : '')
    + `; relative squared error ${count.relative_error}`;
}
