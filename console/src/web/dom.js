// Every node of the page is made here, with createElement and text nodes:
// no markup is ever parsed from data, so an agent's text stays text.

/** Makes an element: `props` sets attributes (`class`, `text`, `on<event>`,
 *  `dataset`), children are nodes or strings (added as text). */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = String(value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Replaces a node's children. */
export function fill(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** "3m 12s" from milliseconds. */
export function duration(ms) {
  if (ms === null || ms === undefined || ms < 0) return '';
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}

/** How long a session has lived (to its end, or to now). */
export function elapsed(session) {
  if (!session.created_at_ms) return '';
  return duration((session.ended_at_ms || Date.now()) - session.created_at_ms);
}

export const ENDED = new Set(['completed', 'failed', 'terminated']);

export function isActive(session) {
  return !ENDED.has(session.status);
}

export function statusBadge(status) {
  return el('span', { class: `status status-${status}`, text: status });
}

/** A link to a route of the page (`#/...`). */
export function link(route, ...children) {
  return el('a', { href: `#${route}` }, ...children);
}

export function usd(text) {
  return text ? `$${text}` : '';
}
