// The tab's requests: the cache of answers (each key fetched once while it
// is kept, the least recently used dropped past a fixed number), and the
// guard that lets an answer draw only while its view still wants the state it
// was asked for. No DOM: runs under node.

/**
 * How many answers the tab keeps. One screen needs about 30 at once: the layer view's series
 * (three tensors, two per weight: up to 11 for a layer with four weights), its /updates,
 * /routing, /step and two /routing_map bodies; the gradient flow's /step of two runs at the
 * slider's step and four kept ones (10); the time view's two /timeline bodies and /onset; /runs.
 * Twice that keeps every section's answers while the user moves between them, and the last few
 * steps and layers visited, so that going back is not fetched again; a slider dragged over
 * thousands of steps still holds this many bodies, not one per step.
 */
export const CACHE_ENTRIES = 64;

/** The cache's key of a key (an array of plain values). */
const idOf = (key) => JSON.stringify(key);

/**
 * Answers by key, fetched once while kept: a least-recently-used map of
 * promises. A failed fetch is forgotten, so that it is retried.
 */
export class AnswerCache {
  constructor(limit = CACHE_ENTRIES) {
    if (!(Number.isInteger(limit) && limit > 0)) {
      throw new RangeError(`AnswerCache limit must be a positive integer; received: ${limit}`);
    }
    this.limit = limit;
    this.answers = new Map(); // id -> promise, least recently used first
  }

  /** The answer of `key`: `fetch()`'s promise, fetched when `key` is not kept. */
  get(key, fetch) {
    const id = idOf(key);
    let answer = this.answers.get(id);
    if (answer === undefined) {
      answer = fetch().catch((error) => {
        // Only this fetch's own entry: a clear() and a new fetch of the key may have replaced it.
        if (this.answers.get(id) === answer) this.answers.delete(id);
        throw error;
      });
    } else {
      this.answers.delete(id); // set again below: now the most recently used
    }
    this.answers.set(id, answer);
    while (this.answers.size > this.limit) this.answers.delete(this.answers.keys().next().value);
    return answer;
  }

  /** Whether `key` is kept. */
  has(key) {
    return this.answers.has(idOf(key));
  }

  get size() {
    return this.answers.size;
  }

  clear() {
    this.answers.clear();
  }
}

/**
 * One view's guard against late answers: an answer is applied only if its
 * request is the view's latest one and the state it was asked for (run,
 * colour, step, width, ...) is still the view's state. An older request that
 * answers after a newer one (a slow /timeline of the previous colour), or a
 * request made before a reload, is dropped instead of drawing over it.
 *
 *     const ticket = this.requests.start(this.state());
 *     const body = await fetch...;
 *     if (!this.requests.isCurrent(ticket, this.state())) return;
 */
export class LatestRequest {
  constructor() {
    this.latest = null;
  }

  /** A new request for `state` (plain values): every earlier one is no longer current. */
  start(state) {
    this.latest = {state: idOf(state)};
    return this.latest;
  }

  /** Whether `ticket` is the latest request and `state`, the view's state now, the one it asked for. */
  isCurrent(ticket, state) {
    return ticket === this.latest && ticket.state === idOf(state);
  }
}
