// What a view has drawn, said on its own element: `data-drawn` holds the
// state (run, layer, step, ...) of the data the view shows, set once that
// data is fetched and in the DOM or on the canvas. A view that is still
// fetching or drawing a new state keeps the marker of the one it shows, so a
// reader (a test, a bench) that waits for the marker of the state it asked
// for reads that state's drawing, never the previous one's.

/**
 * The marker of `state`: JSON of its entries with the keys in sorted order,
 * so that one state has one text whatever the order it was built in.
 * Values are strings, numbers, booleans, null or arrays of them.
 */
export function drawnState(state) {
  return JSON.stringify(Object.fromEntries(Object.keys(state).sort().map((key) => [key, state[key]])));
}

// Per element, the latest markWhenDrawn still waiting for its drawing to finish.
const WAITING = new WeakMap();

/** Says on `element` that it now shows `state`: call once the drawing is done. */
export function markDrawn(element, state) {
  WAITING.delete(element);
  element.setAttribute('data-drawn', drawnState(state));
}

/**
 * Marks `elements` with `state` once `drawing` has resolved (the last part of a drawing that
 * waits for a fetch, such as the record of a downsampled series at one step), unless another
 * drawing of them has been marked or asked to be marked since: an earlier state that finishes
 * late never overwrites a later one's marker.
 */
export function markWhenDrawn(elements, state, drawing) {
  const ticket = {};
  for (const element of elements) WAITING.set(element, ticket);
  return Promise.resolve(drawing).then(() => {
    for (const element of elements) if (WAITING.get(element) === ticket) markDrawn(element, state);
  });
}
