// Lists paged by the management API as RabbitMQ pages them (page, page_size, name with
// use_regex, sort, sort_reverse): the browser holds one page of rows however long the list.
import { ApiError, get } from './api.js';
import { button, field, fill, h, num, select } from './dom.js';

// A page of `base` for state {page, size, filter, regex, sort, reverse}. Past the last page
// (the list shrank since: RabbitMQ's 400 page_out_of_range) it is the last page instead.
export async function getPage(base, state) {
  const url = (page) => {
    const p = { page: String(page), page_size: String(state.size) };
    if (state.filter) Object.assign(p, { name: state.filter, use_regex: String(state.regex !== false) });
    if (state.sort) Object.assign(p, { sort: state.sort, sort_reverse: String(Boolean(state.reverse)) });
    return `${base}?${new URLSearchParams(p)}`;
  };
  try {
    return await get(url(state.page));
  } catch (e) {
    if (!(e instanceof ApiError) || e.error !== 'page_out_of_range' || state.page <= 1) throw e;
    const first = await get(url(1));
    state.page = Math.max(1, first.page_count);
    return state.page === 1 ? first : get(url(state.page));
  }
}

// "n of m <things>, a-b shown": after the filter, of the whole list.
export function summaryText(data, things) {
  const shown = data.item_count
    ? `, ${num((data.page - 1) * data.page_size + 1)}-${num((data.page - 1) * data.page_size + data.item_count)} shown` : '';
  return `${num(data.filtered_count)} of ${num(data.total_count)} ${things}${shown}`;
}

// Previous, "Page n of m", Next; go() once state.page has changed.
export function fillPager(el, state, data, go) {
  const pages = Math.max(1, data.page_count);
  const prev = button('« Previous', () => { state.page -= 1; go(); });
  const next = button('Next »', () => { state.page += 1; go(); });
  prev.disabled = state.page <= 1;
  next.disabled = state.page >= pages;
  fill(el, prev, h('span', null, ` Page ${data.page} of ${num(pages)} `), next);
}

// The toolbar of a paged list: a name filter (regex or substring, as the API's use_regex)
// and the page size; changed() after the state changed (back to page 1).
export function listToolbar(state, { id, changed }) {
  const filter = h('input', { type: 'search', id: `${id}-filter`, value: state.filter, 'aria-label': 'Filter by name' });
  const regex = h('input', { type: 'checkbox', id: `${id}-regex`, checked: state.regex });
  const size = select('page_size', ['20', '100', '500'], String(state.size));
  let typing;
  filter.addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.filter = filter.value; state.page = 1; changed(); }, 300);
  });
  regex.addEventListener('change', () => { state.regex = regex.checked; state.page = 1; changed(); });
  size.addEventListener('change', () => { state.size = Number(size.value); state.page = 1; changed(); });
  return h('div', { class: 'toolbar' }, field('Filter', filter), h('label', null, regex, ' Regex'), field('Per page', size));
}
