// The console's page: sign-in, then the views by route (#/ workspaces,
// #/w/WS a workspace's trees, #/w/WS/t/TREE one tree, #/s/ID a session).
// The operator token is sent once, in the sign-in request's body; it is
// kept nowhere (not in storage, the URL or the page).

import { ApiError, get, post, setCsrf, enc } from './api.js';
import { ENDED as ENDS, el, fill, isActive, link } from './dom.js';
import { follow, onLiveState } from './live.js';
import { sessionView } from './session.js';
import { TreeModel, TreeView, tickElapsed } from './tree.js';
import { workspacesView } from './workspaces.js';

const main = document.getElementById('main');
const crumbs = document.getElementById('crumbs');
const signOutButton = document.getElementById('sign-out');
const liveState = document.getElementById('live-state');
let teardown = () => {};

onLiveState((state) => {
  liveState.textContent = state;
  liveState.className = `live-${state}`;
});

function navigate(route) {
  window.location.hash = `#${route}`;
}

function signInView(message) {
  teardown();
  teardown = () => {};
  signOutButton.hidden = true;
  fill(crumbs);
  const token = el('input', { id: 'token', type: 'password', autocomplete: 'current-password', required: true, placeholder: 'operator token' });
  const error = el('p', { id: 'sign-in-error', class: 'notice error', text: message || '' });
  const form = el('form', { id: 'sign-in-form', class: 'sign-in' },
    el('h1', { text: 'Sign in' }),
    el('p', { class: 'muted', text: 'The operator token (troupe-session writes it to <data-dir>/operator.token).' }),
    token, el('button', { id: 'sign-in', type: 'submit', text: 'Sign in' }), error);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const value = token.value;
    token.value = '';
    try {
      const session = await post('/api/sign-in', { token: value });
      setCsrf(session.csrf_token);
      route();
    } catch (err) {
      error.textContent = err instanceof ApiError && err.status === 401 ? 'That is not the operator token.' : err.message;
    }
  });
  fill(main, form);
  token.focus();
}

function treeView(workspace, tree) {
  fill(crumbs, link('/', 'workspaces'), ' / ', link(`/w/${enc(workspace)}`, workspace), tree ? [' / ', el('span', { text: tree })] : null);
  const model = new TreeModel();
  const view = new TreeView(model);
  fill(main, el('h1', { text: tree ? `Tree ${tree}` : `Workspace ${workspace}` }), view.node);
  let stream = null;
  let scheduled = false;
  const render = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      view.render();
    });
  };
  const params = tree ? `tree=${enc(tree)}&` : '';
  const snapshotUrl = (after) => `/api/workspaces/${enc(workspace)}/sessions?${params}after=${enc(after)}`;
  // Refusals are audit entries, not events: the new ones are read while the
  // tree lives (the tree view shows those of its own sessions).
  let rereading = false;
  let auditCursor = null;
  let closed = false;
  const rereadRefusals = (force) => {
    if (rereading || auditCursor === null || !(force || [...model.nodes.values()].some(isActive))) return;
    rereading = true;
    get(`/api/refused?workspace=${enc(workspace)}&after=${auditCursor}`).then((answer) => {
      auditCursor = answer.audit_cursor;
      if (answer.refused.length) {
        model.refused.push(...answer.refused);
        render();
      }
    }).catch(() => {}).finally(() => { rereading = false; });
  };
  // The snapshot comes in pages (a parent before its children): the first
  // is drawn at once, the next ones once a second at most (each drawing
  // lays out the whole tree again) and the last at once; then events are
  // followed from the first page's cursor, read before any page, so that
  // an event may repeat what a page showed but none is missed.
  const load = async () => {
    let page = await get(snapshotUrl(''));
    const cursor = page.cursor;
    auditCursor = page.audit_cursor;
    model.load(page);
    view.render();
    let drawn = performance.now();
    while (page.next && !closed) {
      page = await get(snapshotUrl(page.next));
      model.load(page);
      if (!page.next || performance.now() - drawn >= 1000) {
        render();
        drawn = performance.now();
      }
    }
    if (closed) return;
    stream = follow({ workspace, tree, output: false }, cursor, (event) => {
      model.apply(event);
      render();
      if (ENDS.has(event.kind)) rereadRefusals(true);
    }, (kind) => (kind === 'signed_out' ? signInView('Signed out.') : null));
  };
  load().catch(fail);
  const timer = setInterval(() => tickElapsed(view.node), 1000);
  const refusals = setInterval(() => rereadRefusals(false), 2000);
  return () => {
    closed = true;
    clearInterval(timer);
    clearInterval(refusals);
    if (stream) stream.close();
  };
}

function fail(err) {
  if (err instanceof ApiError && err.status === 401) signInView('Your sign-in has ended; sign in again.');
  else fill(main, el('p', { class: 'notice error', text: err.message }));
}

function route() {
  teardown();
  teardown = () => {};
  signOutButton.hidden = false;
  const parts = (window.location.hash.replace(/^#\/?/, '') || '').split('/').map(decodeURIComponent);
  if (parts[0] === 'w' && parts[1]) {
    teardown = treeView(parts[1], parts[2] === 't' ? parts[3] : '');
  } else if (parts[0] === 's' && parts[1]) {
    fill(crumbs, link('/', 'workspaces'), ' / ', el('span', { text: parts[1] }));
    teardown = sessionView(main, parts[1], () => signInView('Your sign-in has ended; sign in again.'));
  } else {
    fill(crumbs);
    workspacesView(main, navigate).catch(fail);
  }
}

signOutButton.addEventListener('click', async () => {
  try {
    await post('/api/sign-out', {});
  } finally {
    setCsrf(null);
    signInView('Signed out.');
  }
});

window.addEventListener('hashchange', () => {
  if (!signOutButton.hidden) route();
});

get('/api/session').then((session) => {
  setCsrf(session.csrf_token);
  route();
}).catch((err) => {
  if (err instanceof ApiError && err.status === 401) signInView('');
  else fill(main, el('p', { class: 'notice error', text: err.message }));
});
