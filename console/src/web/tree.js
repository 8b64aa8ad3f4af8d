// A workspace's (or one tree's) live spawn tree: the snapshot the API
// gives, then every event applied as it comes. Children nest under their
// parent, collapsible, active branches open; refused spawns under the
// session they were refused to; trees that ended and orphans (active
// sessions whose parent has ended) in sections of their own.

import { el, fill, link, elapsed, isActive, statusBadge, usd } from './dom.js';

/** Messages a node received that its agent has not been handed yet. */
export function unread(node) {
  return Math.max(0, (node.received || 0) - (node.delivered || 0));
}

export class TreeModel {
  constructor() {
    this.nodes = new Map();
    this.refused = [];
    // Indexes, so a render costs O(sessions): each parent's children (by
    // parent id, '' for none), sorted again only after a change; the ids
    // whose row changed since the view last took them; and whether each
    // node has anything active at or under it (dropped at every change).
    this.kids = new Map();
    this.unsorted = new Set();
    this.changed = new Set();
    this.live = new Map();
  }

  add(node) {
    this.nodes.set(node.session_id, node);
    const parent = node.parent_session_id || '';
    const kids = this.kids.get(parent);
    if (kids) kids.push(node);
    else this.kids.set(parent, [node]);
    this.unsorted.add(parent);
  }

  touched(node) {
    this.changed.add(node.session_id);
    this.live.clear();
  }

  /**
   * A page of the snapshot: each session with its inbox and last progress
   * (the refused spawns come with the first page only).
   */
  load(snapshot) {
    for (const session of snapshot.sessions) {
      const inbox = session.inbox || {};
      const fields = {
        ...session,
        progress: session.progress || null,
        received: inbox.received || 0,
        delivered: inbox.delivered_through || 0,
      };
      const known = this.nodes.get(session.session_id);
      if (known) Object.assign(known, fields);
      else this.add(fields);
      this.unsorted.add(session.parent_session_id || '');
      this.touched(this.nodes.get(session.session_id));
    }
    if (snapshot.refused) this.refused = snapshot.refused;
  }

  node(event) {
    let node = this.nodes.get(event.session_id);
    if (!node) {
      node = {
        session_id: event.session_id,
        parent_session_id: event.parent_session_id,
        tree_id: event.tree_id,
        workspace_id: event.workspace_id,
        depth: event.depth,
        trust: event.trust,
        status: event.status,
        agent_name: '',
        title: '',
        created_at_ms: event.at_ms,
        progress: null,
        received: 0,
        delivered: 0,
        usage: null,
      };
      this.add(node);
    }
    return node;
  }

  /**
   * Applies one event. live.js drops repeats of the stream, and events the
   * snapshot already counted (it may be newer than its cursor) change
   * nothing: the inbox counts are high-water marks of sequences.
   */
  apply(event) {
    const node = this.node(event);
    node.status = event.status;
    const detail = event.detail || {};
    switch (event.kind) {
      case 'created':
        node.agent_name = detail.agent_name;
        node.title = detail.title;
        node.created_at_ms = event.at_ms;
        this.unsorted.add(node.parent_session_id || '');
        break;
      case 'progress':
        node.progress = detail;
        break;
      case 'message':
        node.received = Math.max(node.received, detail.inbox_sequence || 0);
        break;
      case 'delivered':
        node.delivered = Math.max(node.delivered, detail.through_sequence || 0);
        break;
      case 'usage':
        node.usage = detail;
        break;
      case 'completed':
      case 'failed':
      case 'terminated':
        node.ended_at_ms = event.at_ms;
        node.end_reason = detail.reason || node.end_reason;
        break;
      default:
        break;
    }
    this.touched(node);
  }

  /** The ids whose row changed since the last call. */
  takeChanged() {
    const changed = this.changed;
    this.changed = new Set();
    return changed;
  }

  /** A session's children, oldest first (the model's own array: read only). */
  children(id) {
    const key = id || '';
    const kids = this.kids.get(key);
    if (!kids) return [];
    if (this.unsorted.delete(key)) kids.sort((a, b) => (a.created_at_ms || 0) - (b.created_at_ms || 0));
    return kids;
  }

  /** Whether a node or anything under it is active. */
  liveBelow(node) {
    let live = this.live.get(node.session_id);
    if (live === undefined) {
      live = isActive(node) || this.children(node.session_id).some((c) => this.liveBelow(c));
      this.live.set(node.session_id, live);
    }
    return live;
  }
}

/** Whether `a` (an array, or an element's children) holds exactly `b`'s items, in order. */
function same(a, b) {
  return a.length === b.length && b.every((x, i) => a[i] === x);
}

/** Whether `a`'s items are the first of `b`'s, in order. */
function prefix(a, b) {
  if (a.length > b.length) return false;
  for (let i = 0; i < a.length; i += 1) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Makes `parent`'s children exactly `nodes`, touching it only if they
 * differ. Items only added at the end (a page of newer sessions) are
 * appended: moving the ones drawn already would cost their whole subtrees,
 * each page again.
 */
function keep(parent, nodes) {
  if (same(parent.children, nodes)) return;
  if (prefix(parent.children, nodes)) parent.append(...nodes.slice(parent.children.length));
  else parent.replaceChildren(...nodes);
}

function refusedItem(r) {
  return el('li', { class: 'refused' },
    el('span', { class: 'status status-refused', text: 'refused' }),
    el('span', { text: `spawn refused: ${r.reason}` }),
    el('span', { class: 'muted', text: r.detail }));
}

export class TreeView {
  constructor(model) {
    this.model = model;
    this.toggled = new Map(); // session id -> open, as the operator set it
    this.node = el('div', { id: 'tree', class: 'tree' });
    // What is drawn, kept between renders: a render changes only the rows
    // whose session changed and the lists whose members did.
    this.items = new Map(); // session id -> { li, row, details, ul, refused, refusedItems }
    this.orphanItems = new Map(); // session id -> li
    this.sections = null;
  }

  row(node) {
    const usage = node.usage || {};
    const progress = node.progress
      ? el('span', { class: 'progress', text: `${node.progress.progress}% ${node.progress.description || ''}` })
      : null;
    return el('div', { class: 'node-row', dataset: { sessionId: node.session_id, status: node.status } },
      statusBadge(node.status),
      link(`/s/${node.session_id}`, el('span', { class: 'node-title', text: node.title || '(untitled)' })),
      el('span', { class: 'agent', text: node.agent_name }),
      el('span', { class: `trust trust-${node.trust}`, text: node.trust }),
      el('span', { class: 'depth', text: `depth ${node.depth}` }),
      el('span', { class: 'elapsed', dataset: { created: node.created_at_ms || '', ended: node.ended_at_ms || '' }, text: elapsed(node) }),
      progress,
      node.received ? el('span', { class: 'inbox', title: 'messages received', text: `${node.received} msg` }) : null,
      unread(node) ? el('span', { class: 'unread', title: 'not yet handed to its agent', text: `${unread(node)} unread` }) : null,
      usage.own_cost_usd ? el('span', { class: 'cost', title: 'own cost / subtree total', text: `${usd(usage.own_cost_usd)} / ${usd(usage.subtree_cost_usd)}` }) : null,
      node.end_reason ? el('span', { class: 'muted', text: node.end_reason }) : null);
  }

  /** A session's item in the tree: a leaf, or a branch with its list. */
  item(node, branch) {
    const row = this.row(node);
    if (!branch) return { li: el('li', { class: 'leaf' }, row), row, details: null };
    const id = node.session_id;
    // Only the operator's own clicks are kept (a `toggle` event also comes
    // when a render opens a branch).
    const summary = el('summary', {}, row);
    const ul = el('ul');
    const details = el('details', {}, summary, ul);
    summary.addEventListener('click', () => this.toggled.set(id, !details.open));
    return { li: el('li', {}, details), row, details, ul, refused: null, refusedItems: [] };
  }

  branch(node, refusedBy, changed) {
    const id = node.session_id;
    const children = this.model.children(id);
    const refused = refusedBy.get(id) || [];
    const isBranch = children.length > 0 || refused.length > 0;
    let item = this.items.get(id);
    if (!item || (item.details !== null) !== isBranch) {
      item = this.item(node, isBranch);
      this.items.set(id, item);
    } else if (changed.has(id)) {
      const row = this.row(node);
      item.row.replaceWith(row);
      item.row = row;
    }
    if (!isBranch) return item.li;
    const open = this.toggled.has(id) ? this.toggled.get(id) : this.model.liveBelow(node);
    if (item.details.open !== open) item.details.open = open;
    if (!item.refused || !same(item.refused, refused)) {
      item.refused = refused;
      item.refusedItems = refused.map(refusedItem);
    }
    keep(item.ul, [...children.map((c) => this.branch(c, refusedBy, changed)), ...item.refusedItems]);
    return item.li;
  }

  /** The three sections, made once. */
  drawnSections() {
    if (!this.sections) {
      const none = el('p', { class: 'muted', text: 'No active tree.' });
      this.sections = {
        activeTitle: el('h2'),
        activeList: el('ul', { class: 'branches' }),
        none,
        orphansTitle: el('h2'),
        orphansList: el('ul', { class: 'branches' }),
        endedTitle: el('h2'),
        endedList: el('ul', { class: 'branches' }),
      };
      const s = this.sections;
      s.active = el('section', { id: 'active-trees' }, s.activeTitle);
      s.orphans = el('section', { id: 'orphans' }, s.orphansTitle, s.orphansList);
      s.ended = el('section', { id: 'ended-trees' }, s.endedTitle, s.endedList);
    }
    return this.sections;
  }

  render() {
    const changed = this.model.takeChanged();
    const nodes = [...this.model.nodes.values()];
    const known = (id) => id && this.model.nodes.has(id);
    const roots = nodes
      .filter((n) => !known(n.parent_session_id))
      .sort((a, b) => (a.created_at_ms || 0) - (b.created_at_ms || 0));
    const orphans = nodes.filter((n) => isActive(n) && (n.orphaned || (known(n.parent_session_id)
      && !isActive(this.model.nodes.get(n.parent_session_id)))));
    const live = roots.filter((r) => this.model.liveBelow(r));
    const ended = roots.filter((r) => !this.model.liveBelow(r));
    const refusedBy = new Map();
    for (const r of this.model.refused) {
      const list = refusedBy.get(r.target);
      if (list) list.push(r);
      else refusedBy.set(r.target, [r]);
    }
    const s = this.drawnSections();
    const title = (h2, text) => {
      if (h2.textContent !== text) h2.textContent = text;
    };
    title(s.activeTitle, `Active (${live.length})`);
    keep(s.activeList, live.map((r) => this.branch(r, refusedBy, changed)));
    keep(s.active, [s.activeTitle, live.length ? s.activeList : s.none]);
    title(s.orphansTitle, `Orphans (${orphans.length})`);
    keep(s.orphansList, orphans.map((o) => {
      let li = this.orphanItems.get(o.session_id);
      if (!li || changed.has(o.session_id)) {
        li = el('li', {}, this.row(o));
        this.orphanItems.set(o.session_id, li);
      }
      return li;
    }));
    title(s.endedTitle, `Ended (${ended.length})`);
    keep(s.endedList, ended.map((r) => this.branch(r, refusedBy, changed)));
    keep(this.node, [s.active, orphans.length ? s.orphans : null, s.ended].filter(Boolean));
  }
}

/** Keeps every `.elapsed` of the page current. */
export function tickElapsed(root) {
  for (const span of root.querySelectorAll('.elapsed[data-created]')) {
    const created = Number(span.dataset.created);
    if (!created || span.dataset.ended) continue;
    const text = elapsed({ created_at_ms: created });
    if (span.textContent !== text) span.textContent = text;
  }
}
