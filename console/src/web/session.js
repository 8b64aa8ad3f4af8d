// One session: its live output, its messages in and out, its children,
// its audit entries, its trace link; and the actions: send it a message,
// terminate it and its subtree (after a confirmation).

import { get, post, enc } from './api.js';
import { el, fill, link, elapsed, isActive, statusBadge, usd } from './dom.js';
import { follow } from './live.js';
import { OutputPane } from './output.js';

function when(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : '';
}

export function sessionView(main, id, onSignedOut) {
  const header = el('div', { id: 'session-header' });
  const actions = el('div', { id: 'session-actions' });
  const pane = new OutputPane();
  const messages = el('div', { id: 'messages' });
  const children = el('div', { id: 'children' });
  const audit = el('div', { id: 'audit' });
  const notice = el('p', { id: 'notice', class: 'notice', role: 'status' });
  let current = null;

  fill(main,
    header, actions, notice,
    el('div', { class: 'columns' },
      el('section', { class: 'wide' }, el('h2', { text: 'Output' }), pane.node),
      el('section', {}, el('h2', { text: 'Messages' }), messages, el('h2', { text: 'Children' }), children)),
    el('section', {}, el('h2', { text: 'Audit' }), audit));

  const say = (text, error = false) => {
    notice.textContent = text;
    notice.className = error ? 'notice error' : 'notice';
  };

  function renderHeader(s) {
    const usage = s.usage || {};
    fill(header,
      el('h1', {}, statusBadge(s.status), ' ', el('span', { id: 'session-title', text: s.title || '(untitled)' })),
      el('dl', { class: 'facts' }, [
        ['session', s.session_id], ['agent', s.agent_name], ['workspace', s.workspace_id],
        ['trust', s.trust], ['depth', s.depth], ['elapsed', elapsed(s)],
        ['cost', usage.own_cost_usd ? `${usd(usage.own_cost_usd)} own, ${usd(usage.subtree_cost_usd)} subtree` : ''],
        ['ended', s.end_reason || ''],
      ].filter(([, v]) => v !== '' && v !== undefined).map(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })])),
      el('p', {},
        link(`/w/${s.workspace_id}/t/${s.tree_id}`, 'its tree'),
        s.parent_session_id ? [' · ', link(`/s/${s.parent_session_id}`, 'its parent')] : null,
        s.trace_url ? [' · ', el('a', { href: s.trace_url, rel: 'noopener noreferrer', target: '_blank', id: 'trace-link', text: 'trace' })] : null));
  }

  function renderActions(s) {
    if (!isActive(s)) {
      fill(actions);
      return;
    }
    const text = el('textarea', { id: 'message-text', rows: 3, placeholder: 'Message to this session' });
    const send = el('button', { id: 'send', type: 'submit', text: 'Send' });
    const form = el('form', { id: 'message-form' }, text, send);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      if (!text.value) return;
      send.disabled = true;
      try {
        const sent = await post(`/api/sessions/${enc(id)}/messages`, { message: text.value, request_id: crypto.randomUUID() });
        text.value = '';
        say(`Message ${sent.sequence} sent (${sent.delivery}).`);
        refresh();
      } catch (err) {
        say(`Not sent: ${err.message}`, true);
      } finally {
        send.disabled = false;
      }
    });
    const terminate = el('button', { id: 'terminate', type: 'button', class: 'danger', text: 'Terminate…' });
    const confirmBox = el('span', { id: 'confirm-box', hidden: true });
    terminate.addEventListener('click', () => {
      fill(confirmBox,
        el('span', { text: `End this session and every session below it? ` }),
        el('button', { id: 'confirm-terminate', type: 'button', class: 'danger', text: 'Terminate the subtree', onclick: async () => {
          try {
            const ended = await post(`/api/sessions/${enc(id)}/terminate`, { reason: 'manual' });
            say(`Terminated ${ended.terminated_session_ids.length} session(s).`);
          } catch (err) {
            say(`Not terminated: ${err.message}`, true);
          }
          confirmBox.hidden = true;
          refresh();
        } }),
        el('button', { type: 'button', text: 'Cancel', onclick: () => { confirmBox.hidden = true; } }));
      confirmBox.hidden = false;
    });
    fill(actions, form, el('div', {}, terminate, ' ', confirmBox));
  }

  function renderRest(view) {
    fill(messages,
      el('p', { id: 'inbox-counts', class: 'muted', text: `${view.inbox_count} received, ${view.unread_count} unread` }),
      view.messages.length
      ? el('ul', { class: 'messages' }, view.messages.map((m) => el('li', { class: m.to === id ? 'in' : 'out', dataset: { messageId: m.message_id } },
        el('div', { class: 'meta', text: m.to === id
          ? `from ${m.from} · ${when(m.created_at_ms)} · ${m.delivered_at_ms ? 'delivered' : 'unread'}`
          : `to ${m.to} · ${when(m.created_at_ms)}` }),
        el('pre', { class: 'body', text: m.body }))))
      : el('p', { class: 'muted', text: 'No messages.' }));
    const more = (view.children_count || 0) - view.children.length;
    fill(children, view.children.length
      ? el('ul', {}, view.children.map((c) => el('li', { dataset: { sessionId: c.session_id } }, statusBadge(c.status), ' ', link(`/s/${c.session_id}`, el('span', { text: c.title || c.session_id })))))
      : el('p', { class: 'muted', text: 'No children.' }),
    more > 0 ? el('p', { id: 'more-children', class: 'muted', text: `and ${more} more: the tree shows them all` }) : null);
    fill(audit, el('table', {}, el('tbody', {}, view.audit.map((a) => el('tr', { class: a.allowed ? '' : 'refused' },
      el('td', { text: when(a.at_ms) }), el('td', { text: a.caller }), el('td', { text: a.action }),
      el('td', { text: a.target }), el('td', { text: a.allowed ? 'allowed' : a.reason }), el('td', { text: a.detail }))))));
  }

  let refreshing = null;
  let again = false;
  async function refresh() {
    if (refreshing) {
      again = true; // once more when this one is done: it may predate the change
      return;
    }
    refreshing = (async () => {
      try {
        const view = await get(`/api/sessions/${enc(id)}`);
        // The form stays as it is (and what is typed in it) while the session lives.
        const changed = !current || isActive(current) !== isActive(view.session);
        current = view.session;
        renderHeader(current);
        if (changed) renderActions(current);
        renderRest(view);
      } catch (err) {
        if (err.status === 401) onSignedOut();
        else say(err.message, true);
      } finally {
        refreshing = null;
        if (again) {
          again = false;
          refresh();
        }
      }
    })();
  }

  // Each refresh is a GetSession (audited as the CLI's is): on the
  // session's own events at once (after a `delivered` one its messages
  // show as delivered), on its output at most every 2 s, and every 10 s
  // for what changes with no event of its own (its children).
  let lastRefresh = 0;
  let pending = null;
  const soon = () => {
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      lastRefresh = Date.now();
      refresh();
    }, Math.max(0, 2000 - (Date.now() - lastRefresh)));
  };
  refresh();
  const ended = (kind) => (kind === 'signed_out' ? onSignedOut() : say('The event stream was refused; reload.', true));
  const stream = follow({ session: id }, '', (event) => {
    if (event.kind === 'output') {
      pane.output(event.detail.stream, event.detail.text);
      soon();
    } else if (event.kind === 'output_truncated') {
      pane.truncated(event.detail);
    } else {
      lastRefresh = Date.now();
      refresh();
    }
  }, ended);
  const timer = setInterval(() => { if (current && isActive(current)) refresh(); }, 10000);
  return () => {
    clearInterval(timer);
    clearTimeout(pending);
    stream.close();
  };
}
