// The first view: workspaces with their active sessions and cost, and the
// form that starts a root session from an agent definition.

import { get, post, enc } from './api.js';
import { el, fill, link } from './dom.js';

export async function workspacesView(main, navigate) {
  const list = el('div', { id: 'workspaces' }, el('p', { class: 'muted', text: 'Loading…' }));
  const notice = el('p', { id: 'create-notice', class: 'notice', role: 'status' });
  const workspace = el('input', { id: 'create-workspace', name: 'workspace', required: true, placeholder: 'workspace', pattern: '[a-z0-9][a-z0-9_-]*' });
  const agent = el('input', { id: 'create-agent', name: 'agent', required: true, placeholder: 'agent', list: 'agent-names' });
  const title = el('input', { id: 'create-title', name: 'title', placeholder: 'title' });
  const trust = el('select', { id: 'create-trust', name: 'trust' },
    el('option', { value: 'sandboxed', text: 'sandboxed' }), el('option', { value: 'direct', text: 'direct' }));
  const message = el('textarea', { id: 'create-message', name: 'message', rows: 3, placeholder: 'first message (its task)' });
  const names = el('datalist', { id: 'agent-names' });
  const form = el('form', { id: 'create-form', class: 'create' },
    el('h2', { text: 'Start a root session' }), workspace, agent, names, title, trust, message,
    el('button', { type: 'submit', id: 'create', text: 'Start' }), notice);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const created = await post('/api/sessions', {
        workspace_id: workspace.value.trim(), agent_name: agent.value.trim(), title: title.value,
        message: message.value, trust_level: trust.value, request_id: crypto.randomUUID(),
      });
      navigate(`/s/${created.session.session_id}`);
    } catch (err) {
      notice.textContent = `Not started: ${err.message}`;
      notice.className = 'notice error';
    }
  });
  fill(main, el('h1', { text: 'Workspaces' }), list, form);

  // The agents a session of the workspace typed could run.
  const suggest = () => {
    get(`/api/agents?workspace=${enc(workspace.value.trim())}`).then((answer) => {
      const seen = new Set();
      fill(names, answer.agents.filter((a) => !seen.has(a.name) && seen.add(a.name))
        .map((a) => el('option', { value: a.name, text: a.file ? `${a.name} (file)` : a.name })));
    }).catch(() => {});
  };
  workspace.addEventListener('change', suggest);
  suggest();
  const answer = await get('/api/workspaces');
  fill(list, answer.workspaces.length
    ? el('table', {},
      el('thead', {}, el('tr', {}, ['workspace', 'active', 'trees', 'cost'].map((h) => el('th', { text: h })))),
      el('tbody', {}, answer.workspaces.map((w) => el('tr', { dataset: { workspaceId: w.workspace_id } },
        el('td', {}, link(`/w/${enc(w.workspace_id)}`, w.workspace_id)),
        el('td', { text: w.active }), el('td', { text: w.trees }), el('td', { text: `$${w.cost_usd}` })))))
    : el('p', { class: 'muted', text: 'No workspace yet.' }));
  return () => {};
}
