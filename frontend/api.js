// Fetching the routes of docs/API.md and parsing their answers, with the
// non-finite numbers TensorBoard writes as text turned back into numbers. No
// DOM: runs under node (model.js re-exports it).

const NON_FINITE = new Map([['NaN', NaN], ['Infinity', Infinity], ['-Infinity', -Infinity]]);

// Keys whose values are names. A layer may well be called "NaN"; it must stay
// a string, while the same text anywhere else is TensorBoard's encoding of a
// non-finite float.
const NAME_KEYS = new Set([
  'run', 'layer', 'tensor', 'role', 'layer_class', 'layer_dtype', 'dtype', 'type', 'padding',
  'data_format', 'reference_layer', 'flag', 'detail', 'weight',
]);

// Keys whose values are lists of names (/runs' `weights` and `updates`). The
// reviver sees their items before the list, under their index: a weight
// called "NaN" comes back as a number, and is turned back into its name here.
const NAME_LIST_KEYS = new Set(['weights', 'updates']);

/** A `JSON.parse` reviver that turns "NaN" / "Infinity" / "-Infinity" back into numbers. */
export function reviveNonFinite(key, value) {
  if (NAME_LIST_KEYS.has(key) && Array.isArray(value)) {
    return value.map((item) => (typeof item === 'number' && !Number.isFinite(item) ? String(item) : item));
  }
  if (typeof value === 'string' && NON_FINITE.has(value) && !NAME_KEYS.has(key)) {
    return NON_FINITE.get(value);
  }
  return value;
}

/** Parses a body written by TensorBoard's `http_util.Respond`. */
export function parseApiJson(text) {
  return JSON.parse(text, reviveNonFinite);
}

/**
 * Returns the relative URL of a route. Relative, because the page is served
 * under `data/plugin/gradviz/` and possibly under `--path_prefix`.
 */
export function routeUrl(route, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null) query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${route}?${text}` : route;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }
}

export async function fetchJson(route, params = {}, fetchImpl = globalThis.fetch) {
  const url = routeUrl(route, params);
  const response = await fetchImpl(url);
  const text = await response.text();
  if (!response.ok) {
    throw new ApiError(response.status, `${url}: ${response.status} ${text.trim()}`);
  }
  return parseApiJson(text);
}

export async function fetchRuns(fetchImpl) {
  return (await fetchJson('runs', {}, fetchImpl)).runs;
}

/**
 * A tensor's /series: every step, or, past `width` steps, the server's columns
 * of consecutive steps, each with its extremes (`downsampled`; docs/API.md).
 */
export function fetchSeries(run, layer, tensor, fetchImpl, {width} = {}) {
  return fetchJson('series', {run, layer, tensor, width}, fetchImpl);
}

/** A pooling layer's /routing: every step, or with `step` the latest step at or before it alone. */
export function fetchRouting(run, layer, fetchImpl, {step} = {}) {
  return fetchJson('routing', {run, layer, step}, fetchImpl);
}

export function fetchStep(run, step, fetchImpl) {
  return fetchJson('step', {run, step}, fetchImpl);
}

export function fetchUpdates(run, layer, fetchImpl) {
  return fetchJson('updates', {run, layer}, fetchImpl);
}
