// Building DOM for the GradViz tab. Every name shown (run, layer, tensor) is
// data from the log directory: it goes in with textContent or setAttribute,
// never as HTML.

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An HTML element; `text` is set as textContent, `attrs` with setAttribute. */
export function html(tag, {className, text, attrs} = {}, children = []) {
  return fill(document.createElement(tag), className, text, attrs, children);
}

/** An SVG element, filled as `html` fills its elements. */
export function svg(tag, {className, text, attrs} = {}, children = []) {
  return fill(document.createElementNS(SVG_NS, tag), className, text, attrs, children);
}

function fill(node, className, text, attrs, children) {
  if (className) node.setAttribute('class', className);
  if (text !== undefined) node.textContent = text;
  for (const [key, value] of Object.entries(attrs ?? {})) node.setAttribute(key, String(value));
  for (const child of children) if (child) node.append(child);
  return node;
}

/** The hover text of an SVG element. */
export function tooltip(text) {
  return svg('title', {text});
}

/** A coordinate to a tenth of a pixel: shorter SVG, no visible difference. */
export function round(value) {
  return Math.round(value * 10) / 10;
}

/** A `<dl>` of `[name, value]` pairs. */
export function definitionList(pairs, className) {
  return html('dl', {className}, pairs.flatMap(([name, value]) => [html('dt', {text: name}), html('dd', {text: value})]));
}

// A control with its label: <label for>, not a wrapping label, whose name
// would take in a select's current option ("Layer pool (MaxPooling2D)").
// The control's id is derived from its name.
export function labelled(text, control, className) {
  control.id = `gradviz-${control.name}`;
  return html('span', {className: `control ${className ?? ''}`}, [
    html('label', {className: 'label-text', text, attrs: {for: control.id}}), control]);
}

// A section of the tab: its heading, a hint that says how to read it, then its content.
export function hintedSection(className, title, hint, children) {
  return html('section', {className}, [html('h2', {text: title}), html('p', {className: 'hint', text: hint}), ...children]);
}

let measuring = null;

/** The width in CSS pixels of `text` set in `font` (a CSS font shorthand), as the page would draw it. */
export function textWidth(text, font) {
  measuring ??= document.createElement('canvas').getContext('2d');
  measuring.font = font;
  return measuring.measureText(text).width;
}
