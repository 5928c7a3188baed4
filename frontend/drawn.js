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

/** Says on `element` that it now shows `state`: call once the drawing is done. */
export function markDrawn(element, state) {
  element.setAttribute('data-drawn', drawnState(state));
}
