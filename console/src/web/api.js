// The console's JSON API. The CSRF token lives in this module's memory only
// (never in storage or the page); the cookie is the browser's, HttpOnly.

let csrf = null;

export function setCsrf(token) {
  csrf = token;
}

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
    this.reason = body && body.reason;
  }
}

async function answer(response) {
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

export async function get(path) {
  return answer(await fetch(path, {
    credentials: 'same-origin',
    headers: { accept: 'application/json' },
  }));
}

export async function post(path, body) {
  return answer(await fetch(path, {
    method: 'POST',
    credentials: 'same-origin',
    headers: {
      accept: 'application/json',
      'content-type': 'application/json',
      'x-troupe-csrf': csrf || '',
    },
    body: JSON.stringify(body || {}),
  }));
}

export function enc(part) {
  return encodeURIComponent(part);
}
