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
  }

  /** The snapshot: each session with its inbox and last progress. */
  load(snapshot) {
    for (const session of snapshot.sessions) {
      const inbox = session.inbox || {};
      this.nodes.set(session.session_id, {
        ...session,
        progress: session.progress || null,
        received: inbox.received || 0,
        delivered: inbox.delivered_through || 0,
      });
    }
    this.refused = snapshot.refused || [];
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
      this.nodes.set(event.session_id, node);
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
  }

  children(id) {
    return [...this.nodes.values()]
      .filter((n) => n.parent_session_id === id)
      .sort((a, b) => (a.created_at_ms || 0) - (b.created_at_ms || 0));
  }

  /** Whether a node or anything under it is active. */
  liveBelow(node) {
    return isActive(node) || this.children(node.session_id).some((c) => this.liveBelow(c));
  }
}

export class TreeView {
  constructor(model) {
    this.model = model;
    this.toggled = new Map(); // session id -> open, as the operator set it
    this.node = el('div', { id: 'tree', class: 'tree' });
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

  branch(node) {
    const children = this.model.children(node.session_id);
    const refused = this.model.refused.filter((r) => r.target === node.session_id);
    if (!children.length && !refused.length) return el('li', { class: 'leaf' }, this.row(node));
    const open = this.toggled.has(node.session_id)
      ? this.toggled.get(node.session_id)
      : this.model.liveBelow(node);
    // Only the operator's own clicks are kept (a `toggle` event also comes
    // when a render opens a branch).
    const summary = el('summary', {}, this.row(node));
    const details = el('details', { open },
      summary,
      el('ul', {},
        children.map((c) => this.branch(c)),
        refused.map((r) => el('li', { class: 'refused' },
          el('span', { class: 'status status-refused', text: 'refused' }),
          el('span', { text: `spawn refused: ${r.reason}` }),
          el('span', { class: 'muted', text: r.detail })))));
    summary.addEventListener('click', () => this.toggled.set(node.session_id, !details.open));
    return el('li', {}, details);
  }

  render() {
    const nodes = [...this.model.nodes.values()];
    const known = (id) => id && this.model.nodes.has(id);
    const roots = nodes
      .filter((n) => !known(n.parent_session_id))
      .sort((a, b) => (a.created_at_ms || 0) - (b.created_at_ms || 0));
    const orphans = nodes.filter((n) => isActive(n) && (n.orphaned || (known(n.parent_session_id)
      && !isActive(this.model.nodes.get(n.parent_session_id)))));
    const live = roots.filter((r) => this.model.liveBelow(r));
    const ended = roots.filter((r) => !this.model.liveBelow(r));
    fill(this.node,
      el('section', { id: 'active-trees' }, el('h2', { text: `Active (${live.length})` }),
        live.length ? el('ul', { class: 'branches' }, live.map((r) => this.branch(r))) : el('p', { class: 'muted', text: 'No active tree.' })),
      orphans.length ? el('section', { id: 'orphans' }, el('h2', { text: `Orphans (${orphans.length})` }),
        el('ul', { class: 'branches' }, orphans.map((o) => el('li', {}, this.row(o))))) : null,
      el('section', { id: 'ended-trees' }, el('h2', { text: `Ended (${ended.length})` }),
        el('ul', { class: 'branches' }, ended.map((r) => this.branch(r)))));
  }
}

/** Keeps every `.elapsed` of the page current. */
export function tickElapsed(root) {
  for (const span of root.querySelectorAll('.elapsed[data-created]')) {
    const created = Number(span.dataset.created);
    if (!created || span.dataset.ended) continue;
    span.textContent = elapsed({ created_at_ms: created });
  }
}
