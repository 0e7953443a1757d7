// Every action of the console is a call to the management HTTP API, authorized there as any
// other client's (UI2). The credentials live in this tab's sessionStorage (they survive a
// reload, not the tab) and go in an Authorization header the page sets: never a cookie, so
// nothing can be triggered cross-site. Logout forgets them.

const KEY = 'cmq-console-credentials';
let onLoggedOut = () => {};
export const timings = { last: 0, count: 0 };

export class ApiError extends Error {
  constructor(status, error, reason) {
    super(reason || error || `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.reason = reason;
  }
}

function base64(s) {
  let bin = '';
  for (const b of new TextEncoder().encode(s)) bin += String.fromCharCode(b);
  return btoa(bin);
}

export function tokenFor(user, password) { return base64(`${user}:${password}`); }

export function session() {
  try { return JSON.parse(sessionStorage.getItem(KEY) || 'null'); } catch { return null; }
}

export function remember(user, token) { sessionStorage.setItem(KEY, JSON.stringify({ user, token })); }

export function forget() { sessionStorage.removeItem(KEY); }

export function whenLoggedOut(fn) { onLoggedOut = fn; }

export async function api(method, path, body, options = {}) {
  const token = options.token || (session() || {}).token;
  const headers = { Authorization: `Basic ${token || ''}`, ...(options.headers || {}) };
  let payload;
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    payload = typeof body === 'string' ? body : JSON.stringify(body);
  }
  const t0 = performance.now();
  // credentials 'omit': no cookie and no browser login prompt; the header above is the login.
  const r = await fetch(path, { method, headers, body: payload, credentials: 'omit', cache: 'no-store' });
  const raw = await r.text();
  timings.last = performance.now() - t0;
  timings.count += 1;
  let data = null;
  if (raw) { try { data = JSON.parse(raw); } catch { data = raw; } }
  if (!r.ok) {
    const e = data && typeof data === 'object' ? data : {};
    if (r.status === 401 && e.error === 'not_authorized' && !options.token) onLoggedOut('Your login is no longer accepted.');
    throw new ApiError(r.status, e.error, e.reason || (typeof data === 'string' ? data : ''));
  }
  return options.raw ? raw : data;
}

export const get = (path, opts) => api('GET', path, undefined, opts);
