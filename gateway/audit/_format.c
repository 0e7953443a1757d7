/* The audit writer process's per-record work for the broker's rows, in C (issue 31).
 *
 * Why: in scenario 1 the writer process formatted and counted 4 records a message (publish,
 * enqueue, deliver, ack) at ~2.6 us a record in Python (gateway.audit.batch: C-level passes,
 * but a dozen of them, each building lists), 10.6-12.4 us of CPU a message on the same two
 * cores as the event loop and the load generator: the largest item after the loop itself.
 *
 * The contract is the Python path (gateway.audit.writer.AuditLog._format_each and
 * gateway.audit.record's formatters), which runs where this module is not built or when
 * CMQ_GATEWAY_PURE_PYTHON=1; tests/unit/audit/test_format_c.py holds the two to the same
 * bytes and counts on arbitrary records. Anything that is not the plain case (a value of an
 * unusual type, a string UTF-8 cannot take, a timestamp field, a dict record) stops the run,
 * and the caller formats that record in Python.
 *
 *   configure(line_head, rows, prefix_of): line_head b'{"v":2,"ts":"'; rows[i] is None (row id i is formatted in Python) or
 *       (head: bytes 'Z","event":"...","vhost":', number of values, keys: tuple of (value
 *       index, key text: bytes, kind), picks: tuple of value indices); prefix_of(sec) ->
 *       "YYYY-MM-DDTHH:MM:SS." of a whole second.
 *   format_rows(items, start, max_bytes, pending) -> (data, lines, stop, first_ts, why)
 *       items[start:stop] formatted as lines (one hour's folder; at most about max_bytes),
 *       counted into pending[(row id, vhost, picked)]; why: 0 the end of items, 1 max_bytes,
 *       2 another hour, 3 items[stop] is for the Python path.
 *   Records(plain): the records of the event loop, packed as they are emitted (issue 31): a
 *       row's time (the clock time.time reads), id, vhost and values, or a whole item the
 *       caller marshalled (add_item), in emission order. add(row_id, vhost, values) never
 *       raises for a value: one it cannot pack goes as marshal of plain(value).
 *       len() is the number of records, take() the packed bytes (and empties it).
 *       emit_row(row, vhost, values) is AuditLog's emit_row, checks included (watch(limit,
 *       wake_at, shed, wake)): the loop calls it 4 times a message, and as a Python closure
 *       around add it was 4 of scenario 1's ~37 Python frames a message.
 *   unpack(data) -> the list of (time, row id or event, vhost, values or fields) items.
 *       Why: marshal of the queued tuples on the loop at each hand-off cost ~0.66 us a
 *       record of the loop's CPU (thread_time, scenario 1), the tuple and the clock() call
 *       ~0.1 more.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <structmember.h>
#include <math.h>
#include <string.h>
#include <time.h>

/* Kinds, as gateway.audit.record numbers them (_S, _I, _F, _L, _T), and -1 for a key whose
 * value json writes as it is (a boolean, a key outside the schema). */
#define K_STR 0
#define K_INT 1
#define K_FLOAT 2
#define K_LIST 3
#define K_TS 4  /* written by the Python path */
#define K_ANY -1

typedef struct {
    Py_ssize_t index;
    const char *text;  /* ',"key":' */
    Py_ssize_t text_len;
    int kind;
} KeySpec;

typedef struct {
    const char *head;  /* 'Z","event":"publish","vhost":' */
    Py_ssize_t head_len;
    Py_ssize_t nvalues;
    Py_ssize_t nkeys;
    KeySpec *keys;
    Py_ssize_t npicks;
    Py_ssize_t *picks;
} RowSpec;

static PyObject *config;  /* keeps the bytes the specs point into */
static PyObject *prefix_of;
static RowSpec *specs;
#define LINE_HEAD_MAX 32
static char line_head[LINE_HEAD_MAX];  /* '{"v":2,"ts":"' */
static Py_ssize_t line_head_len;
static Py_ssize_t nspecs;

/* The last key counted of each row and how many times since it went into pending: the rows
 * of one queue repeat their key, so most records are counted by comparing pointers. */
typedef struct {
    PyObject *vhost;
    PyObject *picked[4];
    Py_ssize_t n;
} Run;

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t more) {
    Py_ssize_t cap = b->cap ? b->cap : 65536;
    while (cap < b->len + more) cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* The test inline, the growth out of line: the loop's records put a few bytes at a time. */
static inline int buf_reserve(Buf *b, Py_ssize_t more) {
    return b->len + more <= b->cap ? 0 : buf_grow(b, more);
}

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

/* json.encoder.encode_basestring (ensure_ascii=False) of a str, then UTF-8: returns -1 with an
 * error set for memory, -2 (no error) for a str UTF-8 cannot take (a lone surrogate). */
static int put_str(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
        PyErr_Clear();
        return -2;
    }
    if (buf_reserve(b, 6 * n + 2) < 0) return -1;
    char *o = b->p + b->len;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)u[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        default:
            *o++ = 'u'; *o++ = '0'; *o++ = '0';
            *o++ = HEX[c >> 4]; *o++ = HEX[c & 15];
        }
    }
    *o++ = '"';
    b->len = o - b->p;
    return 0;
}

/* int.__repr__ of an exact int. */
static int put_int(Buf *b, PyObject *v) {
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow) {
        if (x == -1 && PyErr_Occurred()) return -1;
        char tmp[24], *e = tmp + sizeof tmp, *q = e;
        unsigned long long m = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
        do {
            *--q = (char)('0' + m % 10);
            m /= 10;
        } while (m);
        if (x < 0) *--q = '-';
        return buf_put(b, q, e - q);
    }
    PyObject *r = PyObject_Repr(v);  /* past 64 bits; raises past sys.int_info's digits */
    if (r == NULL) {
        PyErr_Clear();
        return -2;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(r, &n);
    int rc = s == NULL ? -1 : buf_put(b, s, n);
    Py_DECREF(r);
    return rc;
}

/* What record._fmt_float writes for a float: repr, or json's words for NaN and infinities. */
static int put_float(Buf *b, double x) {
    if (isnan(x)) return buf_put(b, "NaN", 3);
    if (isinf(x)) return x > 0 ? buf_put(b, "Infinity", 8) : buf_put(b, "-Infinity", 9);
    char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL) return -1;
    int rc = buf_put(b, s, (Py_ssize_t)strlen(s));
    PyMem_Free(s);
    return rc;
}

/* One value by its kind; -2: the Python path writes this one. */
static int put_value(Buf *b, int kind, PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    switch (kind) {
    case K_STR:
        return t == &PyUnicode_Type ? put_str(b, v) : -2;
    case K_INT:
        return t == &PyLong_Type ? put_int(b, v) : -2;
    case K_FLOAT:
        return t == &PyFloat_Type ? put_float(b, PyFloat_AS_DOUBLE(v)) : -2;
    case K_LIST: {
        if (t != &PyList_Type && t != &PyTuple_Type) return -2;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        if (buf_put(b, "[", 1) < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (Py_TYPE(items[i]) != &PyUnicode_Type) return -2;
            if (i && buf_put(b, ",", 1) < 0) return -1;
            int rc = put_str(b, items[i]);
            if (rc) return rc;
        }
        return buf_put(b, "]", 1);
    }
    case K_ANY:
        if (v == Py_True) return buf_put(b, "true", 4);
        if (v == Py_False) return buf_put(b, "false", 5);
        return -2;
    default:
        return -2;
    }
}

/* The (row id, vhost, picked) key row.pick and _format_each count by. */
static PyObject *count_key(PyObject *rid, PyObject *vhost, const RowSpec *spec, PyObject **picks) {
    PyObject *picked;
    if (spec->npicks == 0) {
        picked = Py_NewRef(Py_None);
    } else if (spec->npicks == 1) {
        picked = Py_NewRef(picks[0]);
    } else {
        picked = PyTuple_New(spec->npicks);
        if (picked == NULL) return NULL;
        for (Py_ssize_t i = 0; i < spec->npicks; i++)
            PyTuple_SET_ITEM(picked, i, Py_NewRef(picks[i]));
    }
    PyObject *key = PyTuple_New(3);
    if (key == NULL) {
        Py_DECREF(picked);
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, Py_NewRef(rid));
    PyTuple_SET_ITEM(key, 1, Py_NewRef(vhost));
    PyTuple_SET_ITEM(key, 2, picked);
    return key;
}

/* pending[key] += k. */
static int count(PyObject *pending, PyObject *key, Py_ssize_t k) {
    PyObject *old = PyDict_GetItemWithError(pending, key);
    if (old == NULL && PyErr_Occurred()) return -1;
    Py_ssize_t was = 0;
    if (old != NULL) {
        was = PyLong_AsSsize_t(old);
        if (was == -1 && PyErr_Occurred()) return -1;
    }
    PyObject *n = PyLong_FromSsize_t(was + k);
    if (n == NULL) return -1;
    int rc = PyDict_SetItem(pending, key, n);
    Py_DECREF(n);
    return rc;
}

/* pending[(rid, vhost, picked)] += run->n, and the run emptied. */
static int flush_run(PyObject *pending, Py_ssize_t r, const RowSpec *spec, Run *run) {
    if (run->n == 0) return 0;
    PyObject *rid = PyLong_FromSsize_t(r);
    if (rid == NULL) return -1;
    PyObject *key = count_key(rid, run->vhost, spec, run->picked);
    Py_DECREF(rid);
    if (key == NULL) return -1;
    int rc = count(pending, key, run->n);
    Py_DECREF(key);
    run->n = 0;
    return rc;
}

static int flush_runs(PyObject *pending, Run *runs) {
    for (Py_ssize_t r = 0; r < nspecs; r++) {
        if (runs[r].n && flush_run(pending, r, &specs[r], &runs[r]) < 0) return -1;
    }
    return 0;
}

static PyObject *format_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "format_rows(items: list, start: int, max_bytes: int, pending: dict)");
        return NULL;
    }
    if (specs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "format_rows before configure");
        return NULL;
    }
    PyObject *items = args[0], *pending = args[3];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (start < 0) start = 0;
    Buf b = {NULL, 0, 0};
    Run *runs = PyMem_Calloc(nspecs ? nspecs : 1, sizeof(Run));
    if (runs == NULL) return PyErr_NoMemory();
    char prefix[20], first_ts[27];
    char hour[13];
    long long cached_sec = 0;
    int have_sec = 0;
    Py_ssize_t lines = 0, i = start;
    int why = 0;
    for (; i < n; i++) {
        if (b.len >= max_bytes) {
            why = 1;
            break;
        }
        PyObject *item = PyList_GET_ITEM(items, i);
        why = 3;
        if (Py_TYPE(item) != &PyTuple_Type || PyTuple_GET_SIZE(item) != 4) break;
        PyObject *t = PyTuple_GET_ITEM(item, 0), *rid = PyTuple_GET_ITEM(item, 1);
        PyObject *vhost = PyTuple_GET_ITEM(item, 2), *vals = PyTuple_GET_ITEM(item, 3);
        if (Py_TYPE(t) != &PyFloat_Type || Py_TYPE(rid) != &PyLong_Type || Py_TYPE(vhost) != &PyUnicode_Type
            || (Py_TYPE(vals) != &PyTuple_Type && Py_TYPE(vals) != &PyList_Type))
            break;
        Py_ssize_t r = PyLong_AsSsize_t(rid);
        if (r == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        if (r < 0 || r >= nspecs || specs[r].head == NULL) break;
        const RowSpec *spec = &specs[r];
        if (PySequence_Fast_GET_SIZE(vals) != spec->nvalues) break;
        PyObject **values = PySequence_Fast_ITEMS(vals);
        /* The timestamp as format_ts makes it: int(t), round-half-even of the rest, a carry. */
        double tv = PyFloat_AS_DOUBLE(t);
        if (!isfinite(tv) || tv < 0 || tv >= 253402300800.0) break;  /* years 1970-9999 */
        long long sec = (long long)tv;
        double x = (tv - (double)sec) * 1000000.0;
        double rounded = round(x);
        if (fabs(x - rounded) == 0.5) rounded = 2.0 * round(x / 2.0);
        long us = (long)rounded;
        if (us >= 1000000) {
            sec += 1;
            us -= 1000000;
        }
        if (!have_sec || sec != cached_sec) {
            PyObject *p = PyObject_CallFunction(prefix_of, "L", sec);
            if (p == NULL) goto error;
            Py_ssize_t plen;
            const char *ps = PyUnicode_Check(p) ? PyUnicode_AsUTF8AndSize(p, &plen) : NULL;
            if (ps == NULL || plen != 20) {
                Py_DECREF(p);
                PyErr_Clear();
                break;
            }
            if (lines && memcmp(ps, hour, 13) != 0) {  /* another hour: another folder */
                Py_DECREF(p);
                why = 2;
                break;
            }
            memcpy(prefix, ps, 20);
            Py_DECREF(p);
            cached_sec = sec;
            have_sec = 1;
        }
        Py_ssize_t line_start = b.len;
        /* '{"v":2,"ts":"' (line_head), then "YYYY-MM-DDTHH:MM:SS." and the microseconds */
        char ts[LINE_HEAD_MAX + 26];
        memcpy(ts, line_head, line_head_len);
        memcpy(ts + line_head_len, prefix, 20);
        for (int d = 5, u = (int)us; d >= 0; d--, u /= 10) ts[line_head_len + 20 + d] = (char)('0' + u % 10);
        if (buf_put(&b, ts, line_head_len + 26) < 0) goto error;
        if (buf_put(&b, spec->head, spec->head_len) < 0) goto error;
        int rc = put_str(&b, vhost);
        for (Py_ssize_t k = 0; rc == 0 && k < spec->nkeys; k++) {
            const KeySpec *ks = &spec->keys[k];
            PyObject *v = values[ks->index];
            if (v == Py_None) continue;
            if (buf_put(&b, ks->text, ks->text_len) < 0) goto error;
            rc = put_value(&b, ks->kind, v);
        }
        if (rc == 0) rc = buf_put(&b, "}\n", 2);
        if (rc == -1) goto error;
        if (rc == -2) {
            b.len = line_start;
            break;
        }
        /* Counted: a key that cannot be hashed is the Python path's (it raises there). */
        Run *run = &runs[r];
        int same = run->n && run->vhost == vhost;
        for (Py_ssize_t k = 0; same && k < spec->npicks; k++) same = run->picked[k] == values[spec->picks[k]];
        if (!same) {
            for (Py_ssize_t k = 0; k < spec->npicks; k++) {
                PyObject *v = values[spec->picks[k]];
                if (PyObject_Hash(v) == -1) {
                    PyErr_Clear();
                    rc = -2;
                    break;
                }
            }
            if (rc == -2) {
                b.len = line_start;
                break;
            }
            if (flush_run(pending, r, spec, run) < 0) goto error;
            run->vhost = vhost;
            for (Py_ssize_t k = 0; k < spec->npicks; k++) run->picked[k] = values[spec->picks[k]];
        }
        run->n++;
        if (!lines) {
            memcpy(first_ts, ts + line_head_len, 26);
            first_ts[26] = 'Z';
            memcpy(hour, prefix, 13);
        }
        lines++;
        why = 0;
    }
    /* The runs hold borrowed pointers into items, which outlive this call. */
    if (flush_runs(pending, runs) < 0) goto error;
    PyMem_Free(runs);
    runs = NULL;
    PyObject *data = PyBytes_FromStringAndSize(b.p ? b.p : "", b.len);
    PyMem_Free(b.p);
    if (data == NULL) return NULL;
    PyObject *ts_obj = lines ? PyUnicode_FromStringAndSize(first_ts, 27) : Py_NewRef(Py_None);
    if (ts_obj == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NnnNi)", data, lines, i, ts_obj, why);
error:
    PyMem_Free(runs);
    PyMem_Free(b.p);
    return NULL;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *rows, *pf;
    const char *lh;
    Py_ssize_t lh_len;
    if (!PyArg_ParseTuple(args, "y#O!O:configure", &lh, &lh_len, &PyList_Type, &rows, &pf)) return NULL;
    if (lh_len > LINE_HEAD_MAX) {
        PyErr_SetString(PyExc_ValueError, "configure: the line's head is too long");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    RowSpec *made = PyMem_Calloc(n ? n : 1, sizeof(RowSpec));
    if (made == NULL) return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *spec = PyList_GET_ITEM(rows, r);
        if (spec == Py_None) continue;
        PyObject *head, *keys, *picks;
        Py_ssize_t nvalues;
        if (!PyArg_ParseTuple(spec, "O!nO!O!:row", &PyBytes_Type, &head, &nvalues, &PyTuple_Type, &keys,
                              &PyTuple_Type, &picks))
            goto error;
        RowSpec *s = &made[r];
        s->head = PyBytes_AS_STRING(head);
        s->head_len = PyBytes_GET_SIZE(head);
        s->nvalues = nvalues;
        s->nkeys = PyTuple_GET_SIZE(keys);
        s->keys = PyMem_Calloc(s->nkeys ? s->nkeys : 1, sizeof(KeySpec));
        s->npicks = PyTuple_GET_SIZE(picks);
        if (s->npicks > 4) {
            PyErr_SetString(PyExc_ValueError, "configure: more than 4 picks");
            goto error;
        }
        s->picks = PyMem_Calloc(s->npicks ? s->npicks : 1, sizeof(Py_ssize_t));
        if (s->keys == NULL || s->picks == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        for (Py_ssize_t k = 0; k < s->nkeys; k++) {
            PyObject *text;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(keys, k), "nO!i:key", &s->keys[k].index, &PyBytes_Type, &text,
                                  &s->keys[k].kind))
                goto error;
            if (s->keys[k].index < 0 || s->keys[k].index >= nvalues) {
                PyErr_SetString(PyExc_ValueError, "configure: a key's value index out of range");
                goto error;
            }
            s->keys[k].text = PyBytes_AS_STRING(text);
            s->keys[k].text_len = PyBytes_GET_SIZE(text);
        }
        for (Py_ssize_t k = 0; k < s->npicks; k++) {
            s->picks[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(picks, k));
            if (s->picks[k] < 0 || s->picks[k] >= nvalues) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "configure: a pick out of range");
                goto error;
            }
        }
    }
    /* The old specs are not freed: configure runs once at import (a second call leaks a little). */
    Py_INCREF(rows);
    Py_XSETREF(config, rows);
    Py_INCREF(pf);
    Py_XSETREF(prefix_of, pf);
    specs = made;
    nspecs = n;
    memcpy(line_head, lh, lh_len);
    line_head_len = lh_len;
    Py_RETURN_NONE;
error:
    for (Py_ssize_t r = 0; r < n; r++) {
        PyMem_Free(made[r].keys);
        PyMem_Free(made[r].picks);
    }
    PyMem_Free(made);
    return NULL;
}

/* ---- Records: the loop's side ---------------------------------------------------------- */

/* A string at a row's position (0: the vhost, 1 + i: value i) that is the very object the
 * last record of that row had there is packed as 'r': the queue, user, peer and vhost repeat
 * from message to message (the unpacker makes each once per batch, as marshal's references
 * shared them, and format_rows counts them by pointer). */
#define SLOTS 17
#define SLOT_ROWS 32

typedef struct {
    PyObject_HEAD
    Buf buf;
    Buf scratch;  /* one record, while plain() (Python code) may run: then appended whole */
    Py_ssize_t count;
    PyObject *plain;
    /* emit_row's checks (watch): past `limit` records shed() is called instead of packing;
     * wake() when the count reaches wake_at. */
    Py_ssize_t limit;
    Py_ssize_t wake_at;
    PyObject *shed;
    PyObject *wake;
    PyObject *last[SLOT_ROWS][SLOTS];  /* strong references: an address is never reused */
} Records;

static void forget_row(Records *self, long rid) {
    if (rid < 0 || rid >= SLOT_ROWS) return;
    for (int i = 0; i < SLOTS; i++) Py_CLEAR(self->last[rid][i]);
}

static int put_u32(Buf *b, uint32_t v) { return buf_put(b, (const char *)&v, 4); }

static int pack_blob(Buf *b, char tag, PyObject *bytes) {
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    if (n > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_OverflowError, "record too large");
        return -1;
    }
    if (buf_put(b, &tag, 1) < 0 || put_u32(b, (uint32_t)n) < 0) return -1;
    return buf_put(b, PyBytes_AS_STRING(bytes), n);
}

/* A value pack_value's common cases do not take: m, marshal of it (of plain(value) when
 * marshal will not take it). */
static int pack_other(Records *self, Buf *b, PyObject *v) {
    PyObject *m = PyMarshal_WriteObjectToString(v, Py_MARSHAL_VERSION);
    if (m == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
        PyErr_Clear();
        PyObject *p = PyObject_CallOneArg(self->plain, v);
        if (p == NULL) return -1;
        m = PyMarshal_WriteObjectToString(p, Py_MARSHAL_VERSION);
        Py_DECREF(p);
        if (m == NULL) return -1;
    }
    int rc = pack_blob(b, 'm', m);
    Py_DECREF(m);
    return rc;
}

/* s, UTF-8 text; 1 (no error) for a str UTF-8 cannot take (a lone surrogate: marshal takes it). */
static int pack_str(Buf *b, PyObject *v, PyObject **slot) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(v, &n);
    if (u == NULL || n > 0xFFFFFFFFLL) {
        PyErr_Clear();
        return 1;
    }
    if (buf_reserve(b, 5 + n) < 0) return -1;
    char *o = b->p + b->len;
    uint32_t n32 = (uint32_t)n;
    o[0] = 's';
    memcpy(o + 1, &n32, 4);
    memcpy(o + 5, u, n);
    b->len += 5 + n;
    if (slot != NULL) Py_XSETREF(*slot, Py_NewRef(v));
    return 0;
}

/* One value: N none, T/F booleans, i int64, f double, s UTF-8 text, r the string its slot
 * holds, m marshal of anything else. The fixed-size cases are written in place, under one
 * reserve: a message's four records pack ~26 values, and a call and a capacity test for each
 * tag and each number were a third of the records' cost on the loop. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int pack_value(Records *self, Buf *b, PyObject *v, PyObject **slot) {
    PyTypeObject *t = Py_TYPE(v);
    if (buf_reserve(b, 9) < 0) return -1;
    char *o = b->p + b->len;
    if (v == Py_None || v == Py_True || v == Py_False) {
        o[0] = v == Py_None ? 'N' : v == Py_True ? 'T' : 'F';
        b->len += 1;
        return 0;
    }
    if (t == &PyUnicode_Type) {
        if (slot != NULL && *slot == v) {
            o[0] = 'r';
            b->len += 1;
            return 0;
        }
        int rc = pack_str(b, v, slot);
        if (rc <= 0) return rc;
    } else if (t == &PyLong_Type) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow) {
            if (x == -1 && PyErr_Occurred()) return -1;
            o[0] = 'i';
            memcpy(o + 1, &x, 8);
            b->len += 9;
            return 0;
        }
    } else if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(v);
        o[0] = 'f';
        memcpy(o + 1, &x, 8);
        b->len += 9;
        return 0;
    }
    return pack_other(self, b, v);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    return (double)ns / 1e9;  /* as time.time() makes it of the same nanoseconds */
}

/* add(row_id, vhost, values): 'R', time, id (u16), vhost, the number of values (u8), values
 * (``nv`` of them at ``values``: a tuple's or list's items, or emit_values' arguments). */
static int add_values(Records *self, PyObject *row_id, PyObject *vhost, PyObject *const *values, Py_ssize_t nv) {
    if (!PyLong_CheckExact(row_id) || !PyUnicode_CheckExact(vhost)) {
        PyErr_SetString(PyExc_TypeError, "add(row_id: int, vhost: str, values: tuple)");
        return -1;
    }
    long rid = PyLong_AsLong(row_id);
    if (rid < 0 || rid > 0xFFFF || nv > 255) {
        PyErr_SetString(PyExc_ValueError, "add: row id or values out of range");
        return -1;
    }
    Buf *b = &self->scratch;
    b->len = 0;
    double t = now();
    uint16_t r16 = (uint16_t)rid;
    uint8_t n8 = (uint8_t)nv;
    if (buf_reserve(b, 11) < 0) goto fail;
    b->p[0] = 'R';
    memcpy(b->p + 1, &t, 8);
    memcpy(b->p + 9, &r16, 2);
    b->len = 11;
    PyObject **slots = rid < SLOT_ROWS ? self->last[rid] : NULL;
    if (pack_value(self, b, vhost, slots ? &slots[0] : NULL) < 0 || buf_put(b, (const char *)&n8, 1) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < nv; i++) {
        if (pack_value(self, b, values[i], slots && i + 1 < SLOTS ? &slots[i + 1] : NULL) < 0) goto fail;
    }
    if (buf_put(&self->buf, b->p, b->len) < 0) goto fail;
    self->count++;
    return 0;
fail:
    forget_row(self, rid);  /* the unpacker never saw what this record put there */
    return -1;
}

static int add_row(Records *self, PyObject *row_id, PyObject *vhost, PyObject *vals) {
    if (!PyTuple_CheckExact(vals) && !PyList_CheckExact(vals)) {
        PyErr_SetString(PyExc_TypeError, "add(row_id: int, vhost: str, values: tuple)");
        return -1;
    }
    return add_values(self, row_id, vhost, PySequence_Fast_ITEMS(vals), PySequence_Fast_GET_SIZE(vals));
}

static PyObject *records_add(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(row_id: int, vhost: str, values: tuple)");
        return NULL;
    }
    if (add_row(self, args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* emit_row(row, vhost, values): AuditLog's emit_row for the packed records, so the broker's
 * four records a message (publish, enqueue, deliver, ack) cost no Python frame each: add of
 * row.id, shed() instead past the limit, wake() when the count reaches wake_at. */
static PyObject *str_id;

/* row.id read at its slot's offset (Row is a slotted class): PyObject_GetAttr was ~160
 * instructions of each of a message's four records. The offset is the member descriptor's,
 * used while the class's version tag is the one it was read under (a change to the class
 * resets it, as for CPython's own caches); anything else takes the generic call. */
static PyTypeObject *id_type;  /* strong: its address is not reused while cached */
static unsigned int id_version;
static Py_ssize_t id_offset;  /* 0: not a plain object slot */

static PyObject *row_id_of(PyObject *row) {
    PyTypeObject *t = Py_TYPE(row);
    if (t != id_type || id_version == 0 || t->tp_version_tag != id_version) {
        PyObject *d = t->tp_getattro == PyObject_GenericGetAttr ? _PyType_Lookup(t, str_id) : NULL;
        PyMemberDef *m = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) ? ((PyMemberDescrObject *)d)->d_member : NULL;
        id_offset = m != NULL && m->type == T_OBJECT_EX ? m->offset : 0;
        Py_INCREF(t);
        Py_XSETREF(id_type, t);
        id_version = t->tp_version_tag;
    }
    PyObject *v = id_offset ? *(PyObject **)((char *)row + id_offset) : NULL;
    return v != NULL ? Py_NewRef(v) : PyObject_GetAttr(row, str_id);
}

/* emit_row's and emit_values' checks and add, for ``nv`` values at ``values``. */
static PyObject *emit(Records *self, PyObject *row, PyObject *vhost, PyObject *const *values, Py_ssize_t nv) {
    Py_ssize_t n = self->count;
    if (n >= self->limit) {
        if (self->shed == NULL) Py_RETURN_NONE;
        PyObject *r = PyObject_CallNoArgs(self->shed);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    PyObject *rid = row_id_of(row);
    if (rid == NULL) return NULL;
    int rc = add_values(self, rid, vhost, values, nv);
    Py_DECREF(rid);
    if (rc < 0) return NULL;
    if (n == self->wake_at && self->wake != NULL) {
        PyObject *r = PyObject_CallNoArgs(self->wake);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static PyObject *records_emit_row(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "emit_row(row, vhost, values)");
        return NULL;
    }
    PyObject *vals = args[2];
    if (!PyTuple_CheckExact(vals) && !PyList_CheckExact(vals)) {
        /* as add_values would, after the limit's test and row.id's read (emit_row's order) */
        if (self->count >= self->limit) return emit(self, args[0], args[1], NULL, 0);
        PyObject *rid = row_id_of(args[0]);
        if (rid == NULL) return NULL;
        Py_DECREF(rid);
        PyErr_SetString(PyExc_TypeError, "add(row_id: int, vhost: str, values: tuple)");
        return NULL;
    }
    return emit(self, args[0], args[1], PySequence_Fast_ITEMS(vals), PySequence_Fast_GET_SIZE(vals));
}

/* emit_values(row, vhost, *values): emit_row with the values as arguments, so that the
 * broker's four records a message make no tuple each (a tuple's making and freeing was
 * ~150 instructions a record). */
static PyObject *records_emit_values(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "emit_values(row, vhost, *values)");
        return NULL;
    }
    return emit(self, args[0], args[1], args + 2, nargs - 2);
}

/* watch(limit, wake_at, shed, wake): emit_row's checks (None: no call). */
static PyObject *records_watch(Records *self, PyObject *args) {
    Py_ssize_t limit, wake_at;
    PyObject *shed, *wake;
    if (!PyArg_ParseTuple(args, "nnOO:watch", &limit, &wake_at, &shed, &wake)) return NULL;
    self->limit = limit;
    self->wake_at = wake_at;
    Py_XSETREF(self->shed, shed == Py_None ? NULL : Py_NewRef(shed));
    Py_XSETREF(self->wake, wake == Py_None ? NULL : Py_NewRef(wake));
    Py_RETURN_NONE;
}

/* add_item(marshalled): a whole (time, event, vhost, fields) item, marshalled by the caller. */
static PyObject *records_add_item(Records *self, PyObject *arg) {
    if (!PyBytes_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "add_item(bytes)");
        return NULL;
    }
    Py_ssize_t start = self->buf.len;
    if (pack_blob(&self->buf, 'M', arg) < 0) {
        self->buf.len = start;
        return NULL;
    }
    self->count++;
    Py_RETURN_NONE;
}

static PyObject *records_take(Records *self, PyObject *unused) {
    PyObject *out = PyBytes_FromStringAndSize(self->buf.p ? self->buf.p : "", self->buf.len);
    if (out == NULL) return NULL;
    self->buf.len = 0;
    self->count = 0;
    for (long r = 0; r < SLOT_ROWS; r++) forget_row(self, r);  /* each batch unpacks afresh */
    if (self->buf.cap > (1 << 22)) {  /* a burst's buffer is not kept */
        PyMem_Free(self->buf.p);
        self->buf.p = NULL;
        self->buf.cap = 0;
    }
    return out;
}

static Py_ssize_t records_len(Records *self) { return self->count; }

static int records_init(Records *self, PyObject *args, PyObject *kw) {
    PyObject *plain;
    if (!PyArg_ParseTuple(args, "O:Records", &plain)) return -1;
    Py_INCREF(plain);
    Py_XSETREF(self->plain, plain);
    self->limit = PY_SSIZE_T_MAX;
    self->wake_at = -1;
    return 0;
}

/* shed is the AuditLog's bound method, and the AuditLog holds this object: a cycle. */
static int records_traverse(Records *self, visitproc visit, void *arg) {
    Py_VISIT(self->plain);
    Py_VISIT(self->shed);
    Py_VISIT(self->wake);
    return 0;
}

static int records_clear(Records *self) {
    Py_CLEAR(self->plain);
    Py_CLEAR(self->shed);
    Py_CLEAR(self->wake);
    return 0;
}

static void records_dealloc(Records *self) {
    PyObject_GC_UnTrack(self);
    PyMem_Free(self->buf.p);
    PyMem_Free(self->scratch.p);
    for (long r = 0; r < SLOT_ROWS; r++) forget_row(self, r);
    records_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef records_methods[] = {
    {"add", (PyCFunction)(void (*)(void))records_add, METH_FASTCALL, "add(row_id, vhost, values): one row, now."},
    {"add_item", (PyCFunction)records_add_item, METH_O, "add_item(marshal of (time, event, vhost, fields))."},
    {"take", (PyCFunction)records_take, METH_NOARGS, "The packed records, and none left."},
    {"emit_row", (PyCFunction)(void (*)(void))records_emit_row, METH_FASTCALL,
     "emit_row(row, vhost, values): add(row.id, ...) under watch's limit and wake."},
    {"emit_values", (PyCFunction)(void (*)(void))records_emit_values, METH_FASTCALL,
     "emit_values(row, vhost, *values): emit_row(row, vhost, values) without the tuple."},
    {"watch", (PyCFunction)records_watch, METH_VARARGS, "watch(limit, wake_at, shed, wake): emit_row's checks."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods records_seq = {.sq_length = (lenfunc)records_len};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.audit._format.Records",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)records_traverse,
    .tp_clear = (inquiry)records_clear,
    .tp_init = (initproc)records_init,
    .tp_dealloc = (destructor)records_dealloc,
    .tp_methods = records_methods,
    .tp_as_sequence = &records_seq,
};

/* ---- unpack: the writer's side ----------------------------------------------------------- */

typedef struct {
    const char *p, *end;
} Reader;

static int need(Reader *r, Py_ssize_t n) {
    if (r->end - r->p < n) {
        PyErr_SetString(PyExc_ValueError, "unpack: truncated records");
        return -1;
    }
    return 0;
}

static PyObject *read_blob(Reader *r) {
    uint32_t n;
    if (need(r, 4) < 0) return NULL;
    memcpy(&n, r->p, 4);
    r->p += 4;
    if (need(r, n) < 0) return NULL;
    PyObject *o = PyMarshal_ReadObjectFromString(r->p, n);
    r->p += n;
    return o;
}

/* The last string made at each position of a row (0: the vhost, 1 + i: value i), per row id:
 * the queue, user, peer and vhost repeat from record to record, and are made once for all of
 * them (as marshal's references shared them), which also lets format_rows count them by
 * pointer. */


static PyObject *read_value(Reader *r, PyObject **slot) {
    if (need(r, 1) < 0) return NULL;
    char tag = *r->p++;
    switch (tag) {
    case 'N': Py_RETURN_NONE;
    case 'T': Py_RETURN_TRUE;
    case 'F': Py_RETURN_FALSE;
    case 'i': {
        long long x;
        if (need(r, 8) < 0) return NULL;
        memcpy(&x, r->p, 8);
        r->p += 8;
        return PyLong_FromLongLong(x);
    }
    case 'f': {
        double x;
        if (need(r, 8) < 0) return NULL;
        memcpy(&x, r->p, 8);
        r->p += 8;
        return PyFloat_FromDouble(x);
    }
    case 's': {
        uint32_t n;
        if (need(r, 4) < 0) return NULL;
        memcpy(&n, r->p, 4);
        r->p += 4;
        if (need(r, n) < 0) return NULL;
        PyObject *last = slot ? *slot : NULL;
        if (last != NULL && PyUnicode_IS_COMPACT_ASCII(last) && PyUnicode_GET_LENGTH(last) == n
            && memcmp(PyUnicode_DATA(last), r->p, n) == 0) {
            r->p += n;
            return Py_NewRef(last);
        }
        PyObject *s = PyUnicode_DecodeUTF8(r->p, n, NULL);
        r->p += n;
        if (s != NULL && slot != NULL) Py_XSETREF(*slot, Py_NewRef(s));
        return s;
    }
    case 'm': return read_blob(r);
    case 'r':
        if (slot == NULL || *slot == NULL) {
            PyErr_SetString(PyExc_ValueError, "unpack: a repeat of nothing");
            return NULL;
        }
        return Py_NewRef(*slot);
    default:
        PyErr_SetString(PyExc_ValueError, "unpack: unknown value tag");
        return NULL;
    }
}

static PyObject *unpack(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Reader r = {view.buf, (const char *)view.buf + view.len};
    PyObject *out = PyList_New(0);
    PyObject *item = NULL;
    PyObject *slots[SLOT_ROWS][SLOTS] = {{NULL}};
    if (out == NULL) goto done;
    while (r.p < r.end) {
        char tag = *r.p++;
        if (tag == 'M') {
            item = read_blob(&r);
        } else if (tag == 'R') {
            double t;
            uint16_t rid;
            uint8_t nv;
            if (need(&r, 10) < 0) goto fail;
            memcpy(&t, r.p, 8);
            memcpy(&rid, r.p + 8, 2);
            r.p += 10;
            PyObject **row_slots = rid < SLOT_ROWS ? slots[rid] : NULL;
            PyObject *vhost = read_value(&r, row_slots ? &row_slots[0] : NULL);
            if (vhost == NULL) goto fail;
            if (need(&r, 1) < 0) {
                Py_DECREF(vhost);
                goto fail;
            }
            nv = (uint8_t)*r.p++;
            PyObject *values = PyTuple_New(nv);
            if (values == NULL) {
                Py_DECREF(vhost);
                goto fail;
            }
            for (int i = 0; i < nv; i++) {
                PyObject *v = read_value(&r, row_slots && i + 1 < SLOTS ? &row_slots[i + 1] : NULL);
                if (v == NULL) {
                    Py_DECREF(vhost);
                    Py_DECREF(values);
                    goto fail;
                }
                PyTuple_SET_ITEM(values, i, v);
            }
            item = PyTuple_New(4);
            PyObject *tf = PyFloat_FromDouble(t), *ri = PyLong_FromLong(rid);
            if (item == NULL || tf == NULL || ri == NULL) {
                Py_XDECREF(item);
                Py_XDECREF(tf);
                Py_XDECREF(ri);
                Py_DECREF(vhost);
                Py_DECREF(values);
                goto fail;
            }
            PyTuple_SET_ITEM(item, 0, tf);
            PyTuple_SET_ITEM(item, 1, ri);
            PyTuple_SET_ITEM(item, 2, vhost);
            PyTuple_SET_ITEM(item, 3, values);
        } else {
            PyErr_SetString(PyExc_ValueError, "unpack: unknown record tag");
            goto fail;
        }
        if (item == NULL) goto fail;
        int rc = PyList_Append(out, item);
        Py_CLEAR(item);
        if (rc < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    for (int j = 0; j < SLOT_ROWS; j++)
        for (int i = 0; i < SLOTS; i++) Py_XDECREF(slots[j][i]);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"unpack", (PyCFunction)unpack, METH_O, "unpack(data) -> the items Records packed, in order."},
    {"format_rows", (PyCFunction)(void (*)(void))format_rows, METH_FASTCALL,
     "format_rows(items, start, max_bytes, pending) -> (data, lines, stop, first_ts, why)"},
    {"configure", configure, METH_VARARGS, "configure(line_head, rows, prefix_of): the row shapes, once."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_format", NULL, -1, methods};

PyMODINIT_FUNC PyInit__format(void) {
    if (str_id == NULL && (str_id = PyUnicode_InternFromString("id")) == NULL) return NULL;
    if (PyType_Ready(&RecordsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RecordsType);
    if (PyModule_AddObject(m, "Records", (PyObject *)&RecordsType) < 0) {
        Py_DECREF(&RecordsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
