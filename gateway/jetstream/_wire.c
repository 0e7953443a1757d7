/* Runs of NATS messages of one subscription read in C (gateway/jetstream/wire.py says why).

Handlers._take_from reads a read's MSG/HMSG commands one by one in Python; a pull's deliveries
(HMSG with a lone Nats-Msg-Id header) and a publisher's PubAcks (MSG without reply subject) come
in runs of hundreds for one subscription, and the Python reading costs a share of a gateway's
CPU per message (issue 28). Once the Python reading has started such a run, these functions take
the messages after it that belong to the same run and that they understand exactly: one
space between the arguments, numbers of ASCII digits, the message whole in the read, and
(deliveries) the lone id header and UTF-8 subjects. They stop, taking nothing more, at the
first message that is anything else, and the Python reading goes on from there: it is the
reference, and every message taken here is what it would have made of it
(tests/unit/jetstream/test_wire_scan.py compares the two on random and cut reads). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define MAX_ARGS 6
#define MAX_DIGITS 18

static const char MSG_ID_HEAD[] = "NATS/1.0\r\nNats-Msg-Id:";
#define MSG_ID_AT ((Py_ssize_t)(sizeof(MSG_ID_HEAD) - 1))

/* The ASCII characters str.strip() removes. */
static int
is_space(unsigned char c)
{
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
}

/* An argument of ASCII digits only (what int() reads the same), else -1. */
static long long
digits(const char *s, Py_ssize_t n)
{
    long long v = 0;
    Py_ssize_t i;
    if (n <= 0 || n > MAX_DIGITS)
        return -1;
    for (i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static Py_ssize_t
find_crlf(const char *p, Py_ssize_t from, Py_ssize_t end)
{
    /* memchr for the CR: glibc's memmem for a two-byte needle took more instructions than the
       rest of a run's reading (callgrind, ~1.4k a delivery) */
    const char *s = p + from, *last = p + end - 1;
    while (s < last) {
        s = memchr(s, '\r', (size_t)(last - s));
        if (s == NULL)
            return -1;
        if (s[1] == '\n')
            return (Py_ssize_t)(s - p);
        s++;
    }
    return -1;
}

/* The control line at pos split at single spaces: its arguments' starts and lengths, and the
   position of its CRLF. 0 when there is no whole line, an empty argument (two spaces, which
   the Python reading splits otherwise) or more than MAX_ARGS arguments. */
static int
split_line(const char *p, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *eol,
           Py_ssize_t *at, Py_ssize_t *len, int *n)
{
    const char *s = p + pos, *e, *sp;
    int k = 0;
    *eol = find_crlf(p, pos, end);
    if (*eol < 0)
        return 0;
    e = p + *eol;
    for (;;) {
        sp = memchr(s, ' ', (size_t)(e - s));
        if (sp == NULL)
            sp = e;
        if (sp == s || k == MAX_ARGS)
            return 0;
        at[k] = (Py_ssize_t)(s - p);
        len[k] = (Py_ssize_t)(sp - s);
        k++;
        if (sp == e)
            break;
        s = sp + 1;
    }
    *n = k;
    return 1;
}

/* The id's value as str.strip() of its UTF-8 decoding gives it, or NULL with an error set. */
static PyObject *
stripped_id(const char *s, Py_ssize_t n)
{
    Py_ssize_t i, a = 0, b = n;
    PyObject *u, *r;
    for (i = 0; i < n; i++) {
        if ((unsigned char)s[i] >= 0x80) {
            u = PyUnicode_DecodeUTF8(s, n, NULL);
            if (u == NULL)
                return NULL;
            r = PyObject_CallMethod(u, "strip", NULL);
            Py_DECREF(u);
            return r;
        }
    }
    while (a < b && is_space((unsigned char)s[a]))
        a++;
    while (b > a && is_space((unsigned char)s[b - 1]))
        b--;
    return PyUnicode_DecodeASCII(s + a, b - a, NULL);
}

static int
read_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char **p,
          Py_ssize_t *end, Py_ssize_t *pos, long long *sid)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments", want);
        return 0;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "data must be bytes");
        return 0;
    }
    *p = PyBytes_AS_STRING(args[0]);
    *end = PyBytes_GET_SIZE(args[0]);
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred())
        return 0;
    *sid = PyLong_AsLongLong(args[2]);
    if (*sid == -1 && PyErr_Occurred())
        return 0;
    if (*pos < 0)
        *pos = *end;  /* nothing to take */
    return 1;
}

/* The delivery class's four slots (subject, reply, data, headers), where a plain __slots__
   class holds them: take_lone fills them itself rather than calling the class, whose Python
   __init__ (four assignments) was ~1.5k instructions a delivery (issue 28); wire.Delivery says
   so. Any other class is called as it is. */
static const char *const SLOT_NAMES[4] = {"subject", "reply", "data", "headers"};
static PyTypeObject *slots_cls = NULL;
static Py_ssize_t slot_off[4];

static int
has_slots(PyObject *cls)
{
    PyTypeObject *t;
    PyMemberDef *m;
    Py_ssize_t off[4];
    int i;
    if ((PyObject *)slots_cls == cls)
        return 1;
    if (!PyType_Check(cls))
        return 0;
    t = (PyTypeObject *)cls;
    if (t->tp_members == NULL || t->tp_alloc == NULL || t->tp_new != PyBaseObject_Type.tp_new
            || t->tp_dictoffset != 0)
        return 0;
    for (i = 0; i < 4; i++) {
        off[i] = -1;
        for (m = t->tp_members; m->name != NULL; m++) {
            if (strcmp(m->name, SLOT_NAMES[i]) == 0 && m->type == T_OBJECT_EX && !(m->flags & READONLY)) {
                off[i] = m->offset;
                break;
            }
        }
        if (off[i] < 0)
            return 0;
    }
    Py_INCREF(cls);
    Py_XDECREF((PyObject *)slots_cls);
    slots_cls = t;
    memcpy(slot_off, off, sizeof(off));
    return 1;
}

/* cls(subject, reply, data, headers), the four references stolen (released on failure). */
static PyObject *
make_delivery(PyObject *cls, PyObject *v[4])
{
    PyObject *item;
    int i;
    if (has_slots(cls)) {
        item = slots_cls->tp_alloc(slots_cls, 0);
        if (item != NULL) {
            for (i = 0; i < 4; i++)
                *(PyObject **)((char *)item + slot_off[i]) = v[i];
            return item;
        }
    }
    else
        item = PyObject_Vectorcall(cls, v, 4, NULL);
    for (i = 0; i < 4; i++)
        Py_DECREF(v[i]);
    return item;
}

/* take_lone(data, pos, sid, delivery, key, out) -> pos: the deliveries of subscription ``sid``
   from ``pos`` on whose header is a lone Nats-Msg-Id, each appended to ``out`` as
   ``delivery(subject, reply, body, {key: id})``; the position of the first message not taken.
   An error (memory) stops the run there, cleared: the Python reading meets it again itself. */
static PyObject *
take_lone(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *p;
    Py_ssize_t end, pos, eol, at[MAX_ARGS], len[MAX_ARGS];
    long long sid, hsize, size;
    int n;
    PyObject *cls, *key, *out;
    /* A pull's deliveries share their stream's subject: decoded once a run */
    PyObject *last_subject = NULL;
    Py_ssize_t last_at = 0, last_len = -1;
    if (!read_args(args, nargs, 6, &p, &end, &pos, &sid))
        return NULL;
    cls = args[3];
    key = args[4];
    out = args[5];
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    while (pos < end) {
        Py_ssize_t start, stop, body, id_end;
        PyObject *subject, *reply, *data, *id, *headers, *item;
        PyObject *callargs[4];
        if (!split_line(p, pos, end, &eol, at, len, &n))
            break;
        if (!(len[0] == 4 && memcmp(p + at[0], "HMSG", 4) == 0 && (n == 5 || n == 6)))
            break;
        if (digits(p + at[2], len[2]) != sid)
            break;
        hsize = digits(p + at[n - 2], len[n - 2]);
        size = digits(p + at[n - 1], len[n - 1]);
        if (hsize <= 0 || size < hsize)
            break;
        start = eol + 2;
        if (size > end - start - 2)
            break;  /* not whole in this read */
        stop = start + (Py_ssize_t)size;
        body = start + (Py_ssize_t)hsize;
        id_end = body - 4;
        if (id_end < start + MSG_ID_AT || memcmp(p + start, MSG_ID_HEAD, MSG_ID_AT) != 0
                || memcmp(p + id_end, "\r\n\r\n", 4) != 0
                || find_crlf(p, start + MSG_ID_AT, id_end + 2) != id_end)
            break;
        if (last_subject != NULL && len[1] == last_len && memcmp(p + at[1], p + last_at, (size_t)last_len) == 0) {
            subject = last_subject;
            Py_INCREF(subject);
        }
        else {
            subject = PyUnicode_DecodeUTF8(p + at[1], len[1], NULL);
            if (subject == NULL) {
                PyErr_Clear();
                break;
            }
            Py_XDECREF(last_subject);
            last_subject = subject;
            Py_INCREF(last_subject);
            last_at = at[1];
            last_len = len[1];
        }
        reply = n == 6 ? PyUnicode_DecodeUTF8(p + at[3], len[3], NULL) : PyUnicode_New(0, 0);
        if (reply == NULL) {
            Py_DECREF(subject);
            PyErr_Clear();
            break;
        }
        id = stripped_id(p + start + MSG_ID_AT, id_end - start - MSG_ID_AT);
        if (id == NULL) {
            Py_DECREF(subject);
            Py_DECREF(reply);
            PyErr_Clear();
            break;
        }
        data = PyBytes_FromStringAndSize(p + body, stop - body);
        headers = PyDict_New();
        if (data == NULL || headers == NULL || PyDict_SetItem(headers, key, id) < 0) {
            Py_DECREF(subject);
            Py_DECREF(reply);
            Py_DECREF(id);
            Py_XDECREF(data);
            Py_XDECREF(headers);
            PyErr_Clear();
            break;
        }
        Py_DECREF(id);
        callargs[0] = subject;
        callargs[1] = reply;
        callargs[2] = data;
        callargs[3] = headers;
        item = make_delivery(cls, callargs);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            PyErr_Clear();
            break;
        }
        Py_DECREF(item);
        pos = stop + 2;
    }
    Py_XDECREF(last_subject);
    return PyLong_FromSsize_t(pos);
}

/* take_plain(data, pos, sid, out) -> pos: the messages of subscription ``sid`` from ``pos`` on
   without headers or reply subject (MSG with three arguments), each appended to ``out`` as
   (subject, payload) bytes; the position of the first message not taken. */
static PyObject *
take_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *p;
    Py_ssize_t end, pos, eol, at[MAX_ARGS], len[MAX_ARGS];
    long long sid, size;
    int n;
    PyObject *out;
    if (!read_args(args, nargs, 4, &p, &end, &pos, &sid))
        return NULL;
    out = args[3];
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    while (pos < end) {
        Py_ssize_t start;
        PyObject *item;
        if (!split_line(p, pos, end, &eol, at, len, &n))
            break;
        if (!(n == 4 && len[0] == 3 && memcmp(p + at[0], "MSG", 3) == 0))
            break;
        if (digits(p + at[2], len[2]) != sid)
            break;
        size = digits(p + at[3], len[3]);
        start = eol + 2;
        if (size < 0 || size > end - start - 2)
            break;
        {
            /* (subject, data) made directly: Py_BuildValue's format reading was ~700
               instructions a PubAck (callgrind, issue 28) */
            PyObject *subject = PyBytes_FromStringAndSize(p + at[1], len[1]);
            PyObject *data = subject == NULL ? NULL : PyBytes_FromStringAndSize(p + start, (Py_ssize_t)size);
            item = data == NULL ? NULL : PyTuple_New(2);
            if (item == NULL) {
                Py_XDECREF(subject);
                Py_XDECREF(data);
            }
            else {
                PyTuple_SET_ITEM(item, 0, subject);
                PyTuple_SET_ITEM(item, 1, data);
            }
        }
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            PyErr_Clear();
            break;
        }
        Py_DECREF(item);
        pos = start + (Py_ssize_t)size + 2;
    }
    return PyLong_FromSsize_t(pos);
}

/* ack_numbers(reply) -> (delivered, consumer sequence, pending) | None: the three numbers
   Pulls._take reads of a delivery's reply subject ($JS.ACK.<stream>.<consumer>.<delivered>.
   <stream seq>.<consumer seq>.<time>.<pending>, or the form of 11 or more tokens with domain
   and account hash, whose numbers start at the 7th token), as its Python reading makes them
   (split at ".", int() of three tokens). None, leaving the subject to that reading, when a
   token count is neither 9 nor 11 or more, or one of the three tokens is anything but 1 to
   18 ASCII digits (int() reads signs, spaces, underscores and other digits too: the Python
   reading decides those). The split of a str into nine and two int() were ~2.5k instructions
   a delivery (issue 28). */
#define MAX_TOKENS 64
/* The three numbers of a reply subject's bytes, as ack_numbers reads them: 1, or 0 when it
   declines. */
static int
reply_numbers(const char *p, Py_ssize_t size, long long nums[3])
{
    Py_ssize_t i, at, starts[MAX_TOKENS], lens[MAX_TOKENS];
    int n = 0;
    /* memchr for the dots: a byte loop over the subject was most of this call */
    starts[0] = 0;
    for (;;) {
        const char *dot = memchr(p + starts[n], '.', (size_t)(size - starts[n]));
        if (dot == NULL)
            break;
        if (n + 1 >= MAX_TOKENS)
            return 0;
        i = (Py_ssize_t)(dot - p);
        lens[n] = i - starts[n];
        n++;
        starts[n] = i + 1;
    }
    lens[n] = size - starts[n];
    n++;
    if (n == 9)
        at = 4;
    else if (n >= 11)
        at = 6;
    else
        return 0;
    nums[0] = digits(p + starts[at], lens[at]);
    nums[1] = digits(p + starts[at + 2], lens[at + 2]);
    nums[2] = digits(p + starts[at + 4], lens[at + 4]);
    return nums[0] >= 0 && nums[1] >= 0 && nums[2] >= 0;
}

static PyObject *
ack_numbers(PyObject *self, PyObject *reply)
{
    const char *p;
    Py_ssize_t size, i;
    long long nums[3];
    if (!PyUnicode_Check(reply)) {
        PyErr_SetString(PyExc_TypeError, "reply must be a str");
        return NULL;
    }
    p = PyUnicode_AsUTF8AndSize(reply, &size);
    if (p == NULL) {
        PyErr_Clear();  /* lone surrogates: the Python reading's */
        Py_RETURN_NONE;
    }
    if (!reply_numbers(p, size, nums))
        Py_RETURN_NONE;
    {
        PyObject *t = PyTuple_New(3), *v;
        if (t == NULL)
            return NULL;
        for (i = 0; i < 3; i++) {
            v = PyLong_FromLongLong(nums[i]);
            if (v == NULL) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, i, v);
        }
        return t;
    }
}

/* Publisher._replied_plains' reading of a PubAck that says its write is stored: the LSN after
   the last "." of the reply subject, when that is 1 to 18 ASCII digits, and the text is what
   _PUBACK_STORED matches ({"stream":"<no quote>",<\s*>"seq":<0*[1-9][0-9]*>[,}]) with no
   "error" in it. None otherwise, and the Python reading (publisher.stored_lsn, the reference)
   decides: it reads signs, spaces and underscores in the LSN too. The regex match alone was
   ~2.6k instructions a PubAck (callgrind, issue 28). */
static int
is_re_space(unsigned char c)
{
    /* what \s matches in a bytes pattern */
    return c == ' ' || (c >= 0x09 && c <= 0x0d);
}

/* The LSN stored_lsn reads of a reply's subject and data, or -1 where it declines. */
static long long
stored_lsn_of(const char *s, Py_ssize_t sn, const char *d, Py_ssize_t dn)
{
    const char *dot, *q;
    Py_ssize_t i;
    long long lsn;
    static const char HEAD[] = "{\"stream\":\"";
    static const char SEQ[] = "\"seq\":";
    static const char ERR[] = "\"error\"";
    dot = s + sn;  /* the last ".", by hand: memrchr is a GNU extension */
    while (dot > s && dot[-1] != '.')
        dot--;
    if (dot == s)
        return -1;
    dot--;
    lsn = digits(dot + 1, sn - (Py_ssize_t)(dot + 1 - s));
    if (lsn < 0)
        return -1;
    if (dn < (Py_ssize_t)sizeof(HEAD) - 1 || memcmp(d, HEAD, sizeof(HEAD) - 1) != 0)
        return -1;
    i = sizeof(HEAD) - 1;
    q = memchr(d + i, '"', (size_t)(dn - i));
    if (q == NULL)
        return -1;
    i = (Py_ssize_t)(q - d) + 1;
    if (i >= dn || d[i] != ',')
        return -1;
    i++;
    while (i < dn && is_re_space((unsigned char)d[i]))
        i++;
    if (dn - i < (Py_ssize_t)sizeof(SEQ) - 1 || memcmp(d + i, SEQ, sizeof(SEQ) - 1) != 0)
        return -1;
    i += sizeof(SEQ) - 1;
    while (i < dn && d[i] == '0')
        i++;
    if (i >= dn || d[i] < '1' || d[i] > '9')
        return -1;
    while (i < dn && d[i] >= '0' && d[i] <= '9')
        i++;
    if (i >= dn || (d[i] != ',' && d[i] != '}'))
        return -1;
    /* no "error" anywhere (memmem is a GNU extension: memchr for each quote) */
    for (q = memchr(d, '"', (size_t)dn); q != NULL;
         q = memchr(q + 1, '"', (size_t)(dn - (q + 1 - d)))) {
        if (dn - (q - d) >= (Py_ssize_t)sizeof(ERR) - 1 && memcmp(q, ERR, sizeof(ERR) - 1) == 0)
            return -1;
        if (q + 1 >= d + dn)
            break;
    }
    return lsn;
}

static PyObject *
stored_lsn(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long lsn;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "stored_lsn(subject: bytes, data: bytes)");
        return NULL;
    }
    lsn = stored_lsn_of(PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), PyBytes_AS_STRING(args[1]),
                        PyBytes_GET_SIZE(args[1]));
    if (lsn < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(lsn);
}

/* stored_run(replies, i, writes, sent, again, settled, out) -> i: Publisher._replied_plains'
   loop body for its common case, run over replies[i:] in one call (publisher.stored_run is the
   reference): each (subject, data) bytes pair that stored_lsn reads as a stored write's PubAck
   either names no write in ``writes`` (passed over) or one whose settle callable (item 5) is
   ``settled``, which is then taken out of ``writes``, ``sent`` and ``again`` and appended to
   ``out`` as (lsn, its done callable, item 3). Stops at the first reply that is anything else
   and returns its index: the loop body takes it. The loop body was ~2k instructions a PubAck
   (callgrind, issue 28). */
static PyObject *
stored_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *replies, *writes, *sent, *again, *settled, *out;
    Py_ssize_t i, n;
    if (nargs != 7 || !PyList_Check(args[0]) || !PyDict_CheckExact(args[2]) || !PyDict_CheckExact(args[3])
            || !PySet_CheckExact(args[4]) || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "stored_run(replies: list, i, writes: dict, sent: dict, again: set, "
                                         "settled, out: list)");
        return NULL;
    }
    replies = args[0];
    writes = args[2];
    sent = args[3];
    again = args[4];
    settled = args[5];
    out = args[6];
    i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i = 0;
    n = PyList_GET_SIZE(replies);
    for (; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(replies, i), *subject, *data, *key, *w, *item;
        long long lsn;
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2)
            break;
        subject = PyTuple_GET_ITEM(t, 0);
        data = PyTuple_GET_ITEM(t, 1);
        if (!PyBytes_CheckExact(subject) || !PyBytes_CheckExact(data))
            break;
        lsn = stored_lsn_of(PyBytes_AS_STRING(subject), PyBytes_GET_SIZE(subject), PyBytes_AS_STRING(data),
                            PyBytes_GET_SIZE(data));
        if (lsn < 0)
            break;  /* not read here: the loop body's reading */
        key = PyLong_FromLongLong(lsn);
        if (key == NULL)
            return NULL;
        w = PyDict_GetItemWithError(writes, key);
        if (w == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred())
                return NULL;
            continue;  /* settled already (an earlier attempt's answer) */
        }
        if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 6 || PyTuple_GET_ITEM(w, 5) != settled) {
            Py_DECREF(key);
            break;
        }
        item = PyTuple_New(2);
        if (item == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        Py_INCREF(PyTuple_GET_ITEM(w, 3));
        PyTuple_SET_ITEM(item, 1, PyTuple_GET_ITEM(w, 3));
        Py_INCREF(key);
        PyTuple_SET_ITEM(item, 0, key);
        if (PyDict_DelItem(writes, key) < 0 || PyList_Append(out, item) < 0) {
            Py_DECREF(key);
            Py_DECREF(item);
            return NULL;
        }
        Py_DECREF(item);
        {
            int has = PyDict_Contains(sent, key);
            if (has < 0 || (has && PyDict_DelItem(sent, key) < 0)
                    || (PySet_GET_SIZE(again) && PySet_Discard(again, key) < 0)) {
                Py_DECREF(key);
                return NULL;
            }
        }
        Py_DECREF(key);
    }
    return PyLong_FromSsize_t(i);
}

/* Publisher._next_batch's command for a write with one header (a queue message's
   Nats-Msg-Id): wire.hpub(subject, f"{prefix}.{lsn}", headers, payload), the reference, made
   here when every str is ASCII, ``lsn`` is an int of 0 to 18 digits and ``payload`` bytes;
   None otherwise (wire.hpub makes it). The f-strings and encodes were ~1.8k instructions a
   publish (callgrind, issue 28). */
/* ``v``'s decimal digits at ``out`` (room for 20), their count: snprintf's were ~900
   instructions a number (callgrind), most of this call. */
static int
put_decimal(char *out, unsigned long long v)
{
    char tmp[20];
    int n = 0, i;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

static PyObject *
hpub_lsn(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *subject, *prefix, *lsn_obj, *headers, *payload, *key, *value, *reply, *cmd, *out;
    Py_ssize_t pos = 0, sn, pn, kn, vn, bn, hn, rn, n;
    long long lsn;
    int overflow = 0;
    char num[24], lens[64];
    int numlen, lenslen;
    char *w;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "hpub_lsn(subject, prefix, lsn, headers, payload)");
        return NULL;
    }
    subject = args[0];
    prefix = args[1];
    lsn_obj = args[2];
    headers = args[3];
    payload = args[4];
    if (!PyUnicode_CheckExact(subject) || !PyUnicode_CheckExact(prefix) || !PyLong_CheckExact(lsn_obj)
            || !PyDict_CheckExact(headers) || !PyBytes_CheckExact(payload) || PyDict_GET_SIZE(headers) != 1
            || !PyUnicode_IS_ASCII(subject) || !PyUnicode_IS_ASCII(prefix))
        Py_RETURN_NONE;
    if (!PyDict_Next(headers, &pos, &key, &value) || !PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(value)
            || !PyUnicode_IS_ASCII(key) || !PyUnicode_IS_ASCII(value))
        Py_RETURN_NONE;
    lsn = PyLong_AsLongLongAndOverflow(lsn_obj, &overflow);
    if (overflow || lsn < 0 || lsn > 999999999999999999LL) {
        if (PyErr_Occurred())
            PyErr_Clear();
        Py_RETURN_NONE;
    }
    numlen = put_decimal(num, (unsigned long long)lsn);
    sn = PyUnicode_GET_LENGTH(subject);
    pn = PyUnicode_GET_LENGTH(prefix);
    kn = PyUnicode_GET_LENGTH(key);
    vn = PyUnicode_GET_LENGTH(value);
    bn = PyBytes_GET_SIZE(payload);
    rn = pn + 1 + numlen;
    reply = PyUnicode_New(rn, 127);
    if (reply == NULL)
        return NULL;
    w = (char *)PyUnicode_DATA(reply);
    memcpy(w, PyUnicode_DATA(prefix), (size_t)pn);
    w[pn] = '.';
    memcpy(w + pn + 1, num, (size_t)numlen);
    /* NATS/1.0\r\n<k>: <v>\r\n\r\n */
    hn = 10 + kn + 2 + vn + 4;
    lens[0] = ' ';
    lenslen = 1 + put_decimal(lens + 1, (unsigned long long)hn);
    lens[lenslen++] = ' ';
    lenslen += put_decimal(lens + lenslen, (unsigned long long)(hn + bn));
    lens[lenslen++] = '\r';
    lens[lenslen++] = '\n';
    n = 5 + sn + 1 + rn + lenslen + hn + bn + 2;
    cmd = PyBytes_FromStringAndSize(NULL, n);
    if (cmd == NULL) {
        Py_DECREF(reply);
        return NULL;
    }
    w = PyBytes_AS_STRING(cmd);
    memcpy(w, "HPUB ", 5); w += 5;
    memcpy(w, PyUnicode_DATA(subject), (size_t)sn); w += sn;
    *w++ = ' ';
    memcpy(w, PyUnicode_DATA(reply), (size_t)rn); w += rn;
    memcpy(w, lens, (size_t)lenslen); w += lenslen;
    memcpy(w, "NATS/1.0\r\n", 10); w += 10;
    memcpy(w, PyUnicode_DATA(key), (size_t)kn); w += kn;
    memcpy(w, ": ", 2); w += 2;
    memcpy(w, PyUnicode_DATA(value), (size_t)vn); w += vn;
    memcpy(w, "\r\n\r\n", 4); w += 4;
    memcpy(w, PyBytes_AS_STRING(payload), (size_t)bn); w += bn;
    memcpy(w, "\r\n", 2);
    out = PyTuple_New(5);
    if (out == NULL) {
        Py_DECREF(reply);
        Py_DECREF(cmd);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, cmd);
    Py_INCREF(subject);
    PyTuple_SET_ITEM(out, 1, subject);
    PyTuple_SET_ITEM(out, 2, reply);
    Py_INCREF(payload);
    PyTuple_SET_ITEM(out, 3, payload);
    Py_INCREF(headers);
    PyTuple_SET_ITEM(out, 4, headers);
    return out;
}

/* hpub_run(outbox, writes, sent, again, prefix, now, max_sent, max_batch, batch, commands):
   Publisher._next_batch's loop body over its outbox (a deque of LSNs) in one call
   (publisher.hpub_run is the reference): while the outbox has an LSN, ``sent`` fewer than
   ``max_sent`` and ``batch`` fewer than ``max_batch``, the first LSN is passed over (popped)
   when it has no write in ``writes`` or is in ``sent`` or ``again``; else, when hpub_lsn makes
   its write's command, it is popped, ``sent[lsn] = now``, appended to ``batch`` and its
   command to ``commands``. Stops, leaving it in the outbox, at a write hpub_lsn declines
   (wire.hpub's, in the loop body). The loop body was ~2k instructions a write (issue 28). */
static PyObject *popleft_name = NULL;

static PyObject *
hpub_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *outbox, *writes, *sent, *again, *prefix, *now, *batch, *commands;
    Py_ssize_t max_sent, max_batch;
    if (nargs != 10 || !PyDict_CheckExact(args[1]) || !PyDict_CheckExact(args[2]) || !PySet_CheckExact(args[3])
            || !PyList_Check(args[8]) || !PyList_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "hpub_run(outbox, writes: dict, sent: dict, again: set, prefix, now, "
                                         "max_sent, max_batch, batch: list, commands: list)");
        return NULL;
    }
    outbox = args[0];
    writes = args[1];
    sent = args[2];
    again = args[3];
    prefix = args[4];
    now = args[5];
    batch = args[8];
    commands = args[9];
    max_sent = PyLong_AsSsize_t(args[6]);
    if (max_sent == -1 && PyErr_Occurred())
        return NULL;
    max_batch = PyLong_AsSsize_t(args[7]);
    if (max_batch == -1 && PyErr_Occurred())
        return NULL;
    for (;;) {
        PyObject *lsn, *w, *r, *command, *hargs[5];
        int skip;
        Py_ssize_t left = PyObject_Length(outbox);
        if (left < 0)
            return NULL;
        if (left == 0 || PyDict_GET_SIZE(sent) >= max_sent || PyList_GET_SIZE(batch) >= max_batch)
            break;
        lsn = PySequence_GetItem(outbox, 0);
        if (lsn == NULL)
            return NULL;
        w = PyDict_GetItemWithError(writes, lsn);
        if (w == NULL && PyErr_Occurred()) {
            Py_DECREF(lsn);
            return NULL;
        }
        skip = w == NULL;
        if (!skip) {
            skip = PyDict_Contains(sent, lsn);
            if (skip == 0)
                skip = PySet_Contains(again, lsn);
            if (skip < 0) {
                Py_DECREF(lsn);
                return NULL;
            }
        }
        command = NULL;
        if (!skip) {
            if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 6) {
                Py_DECREF(lsn);
                break;
            }
            hargs[0] = PyTuple_GET_ITEM(w, 0);
            hargs[1] = prefix;
            hargs[2] = lsn;
            hargs[3] = PyTuple_GET_ITEM(w, 2);
            hargs[4] = PyTuple_GET_ITEM(w, 1);
            command = hpub_lsn(NULL, hargs, 5);
            if (command == NULL) {
                Py_DECREF(lsn);
                return NULL;
            }
            if (command == Py_None) {  /* wire.hpub's: the loop body takes it */
                Py_DECREF(command);
                Py_DECREF(lsn);
                break;
            }
        }
        if (popleft_name == NULL && (popleft_name = PyUnicode_InternFromString("popleft")) == NULL) {
            Py_XDECREF(command);
            Py_DECREF(lsn);
            return NULL;
        }
        r = PyObject_CallMethodNoArgs(outbox, popleft_name);
        if (r == NULL) {
            Py_XDECREF(command);
            Py_DECREF(lsn);
            return NULL;
        }
        Py_DECREF(r);
        if (!skip && (PyDict_SetItem(sent, lsn, now) < 0 || PyList_Append(batch, lsn) < 0
                      || PyList_Append(commands, command) < 0)) {
            Py_DECREF(command);
            Py_DECREF(lsn);
            return NULL;
        }
        Py_XDECREF(command);
        Py_DECREF(lsn);
    }
    Py_RETURN_NONE;
}

/* head.stored_message's reading of a queue stream's record head (persistence.encode_message:
   >BdHHHHI, the four names, the message ID, NUL, the properties, the body), as
   persistence.decode_message_head reads it, the reference: (enqueue time, the four names'
   lengths and bytes (a key that tells "a"+"bc" from "ab"+"c"), the properties' bytes, where
   the body starts). None, leaving the record to that
   reading, when the head is short, the ID is not all ASCII (Python decodes it and refuses
   what is not UTF-8) or the NUL or the properties are not there. The Python reading was
   ~3k instructions a pulled message (an unpack, four slices, a find, a decode). */
#define MSG_HEAD_SIZE 21
/* The head of record ``p`` (``n`` bytes) as message_head reads it: 1 with the enqueue time,
   the names' end (they are bytes 9 to it, with their lengths), the properties' start and
   length (the body follows them); 0 when it declines. */
static int
read_head(const unsigned char *p, Py_ssize_t n, double *enq, Py_ssize_t *names_end,
          Py_ssize_t *props_at, Py_ssize_t *props_len)
{
    Py_ssize_t end, nul, lp;
    int i;
    if (n < MSG_HEAD_SIZE)
        return 0;
    *enq = PyFloat_Unpack8((const char *)p + 1, 0);
    if (*enq == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    end = MSG_HEAD_SIZE;
    for (i = 0; i < 4; i++)
        end += ((Py_ssize_t)p[9 + 2 * i] << 8) | p[10 + 2 * i];
    lp = ((Py_ssize_t)p[17] << 24) | ((Py_ssize_t)p[18] << 16) | ((Py_ssize_t)p[19] << 8) | p[20];
    if (end > n)
        return 0;
    for (nul = end; nul < n && p[nul] != 0; nul++) {
        if (p[nul] > 0x7f)
            return 0;
    }
    if (nul >= n || nul + 1 + lp > n)
        return 0;
    *names_end = end;
    *props_at = nul + 1;
    *props_len = lp;
    return 1;
}

static PyObject *
message_head(PyObject *self, PyObject *raw)
{
    const unsigned char *p;
    Py_ssize_t end, pa, lp;
    double enq;
    PyObject *enq_obj, *names, *props, *start, *out;
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "message_head(raw: bytes)");
        return NULL;
    }
    p = (const unsigned char *)PyBytes_AS_STRING(raw);
    if (!read_head(p, PyBytes_GET_SIZE(raw), &enq, &end, &pa, &lp))
        Py_RETURN_NONE;
    enq_obj = PyFloat_FromDouble(enq);
    names = PyBytes_FromStringAndSize((const char *)p + 9, end - 9);  /* with their lengths */
    props = PyBytes_FromStringAndSize((const char *)p + pa, lp);
    start = PyLong_FromSsize_t(pa + lp);
    if (enq_obj == NULL || names == NULL || props == NULL || start == NULL) {
        Py_XDECREF(enq_obj);
        Py_XDECREF(names);
        Py_XDECREF(props);
        Py_XDECREF(start);
        return NULL;
    }
    out = PyTuple_New(4);
    if (out == NULL) {
        Py_DECREF(enq_obj);
        Py_DECREF(names);
        Py_DECREF(props);
        Py_DECREF(start);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, enq_obj);
    PyTuple_SET_ITEM(out, 1, names);
    PyTuple_SET_ITEM(out, 2, props);
    PyTuple_SET_ITEM(out, 3, start);
    return out;
}

/* take_plains(msgs, i, s, now, leases, delays, restore_plain, names, props, new_message,
   init_message, message_cls, cmq_error, key) -> (i, pending | None): Pulls._take's loop body
   for its common case, run over msgs[i:] in one call: each delivery (a wire.Delivery, read
   at its slots) whose reply subject ack_numbers reads, delivered once, whose headers are
   {key: its str id} alone and whose record's head message_head reads, with its names and
   properties already in head.py's caches ``names`` and ``props``: its id popped from
   ``delays`` (when any), its message made as head.stored_message makes it
   (``init_message(new_message(message_cls), body, properties, exchange, routing key, enqueue
   time, (), id)``), leased (``leases[id] = delivery``) and restored
   (``restore_plain(message, len(body), now, id, enqueue time)``, a CMQError of rule Q3
   ignored). ``s.last_delivery`` follows the consumer sequences; the pending count of the
   delivery that last raised it is returned, else None. Stops at the first delivery that is
   anything else, returning its index: the Python loop body (the reference: pulls.take_plains)
   takes it. The loop body, ack_numbers' call and stored_message's frame were ~5k
   instructions a pulled message (callgrind, issue 28). */
static PyObject *object_new = NULL;  /* object.__new__, the new_message take_plains is given */

static PyObject *
take_plains(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *msgs, *s, *now, *leases, *delays, *restore, *names, *props, *new_message, *init, *cls, *cmq_error, *key;
    PyObject *last_pending = NULL, *empty, *ld_obj, *out;
    Py_ssize_t i, n;
    long long last_delivery;
    int overflow = 0, failed = 0;
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "take_plains takes 14 arguments");
        return NULL;
    }
    msgs = args[0];
    s = args[2];
    now = args[3];
    leases = args[4];
    delays = args[5];
    restore = args[6];
    names = args[7];
    props = args[8];
    new_message = args[9];
    init = args[10];
    cls = args[11];
    cmq_error = args[12];
    key = args[13];
    if (!PyList_Check(msgs) || !PyDict_Check(leases) || !PyDict_Check(delays) || !PyDict_Check(names)
            || !PyDict_Check(props)) {
        PyErr_SetString(PyExc_TypeError, "take_plains: msgs a list; leases, delays, names, props dicts");
        return NULL;
    }
    i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    ld_obj = PyObject_GetAttrString(s, "last_delivery");
    if (ld_obj == NULL)
        return NULL;
    last_delivery = PyLong_CheckExact(ld_obj) ? PyLong_AsLongLongAndOverflow(ld_obj, &overflow) : 0;
    if (!PyLong_CheckExact(ld_obj) || overflow || (last_delivery == -1 && PyErr_Occurred())) {
        Py_DECREF(ld_obj);
        PyErr_Clear();
        return Py_BuildValue("(nO)", i, Py_None);  /* not a plain int: the Python reading's */
    }
    Py_DECREF(ld_obj);
    if (object_new == NULL) {
        object_new = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type, "__new__");
        if (object_new == NULL)
            return NULL;
    }
    empty = PyTuple_New(0);
    if (empty == NULL)
        return NULL;
    n = PyList_GET_SIZE(msgs);
    for (; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject *reply, *headers, *data, *msg_id, *dkey, *dval, *four, *pr, *namekey, *propkey;
        PyObject *enq_obj, *body, *msg, *r, *callargs[8];
        const char *rp;
        const unsigned char *dp;
        Py_ssize_t rn, dn, pos = 0, names_end, pa, lp;
        long long nums[3];
        double enq;
        if (!has_slots((PyObject *)Py_TYPE(m)))
            break;
        reply = *(PyObject **)((char *)m + slot_off[1]);
        data = *(PyObject **)((char *)m + slot_off[2]);
        headers = *(PyObject **)((char *)m + slot_off[3]);
        if (reply == NULL || data == NULL || headers == NULL || !PyUnicode_CheckExact(reply)
                || !PyBytes_CheckExact(data) || !PyDict_CheckExact(headers) || PyDict_GET_SIZE(headers) != 1)
            break;
        if (!PyDict_Next(headers, &pos, &dkey, &dval) || !PyUnicode_CheckExact(dkey) || !PyUnicode_CheckExact(dval))
            break;
        if (dkey != key && PyUnicode_Compare(dkey, key) != 0) {
            if (PyErr_Occurred())
                PyErr_Clear();
            break;
        }
        msg_id = dval;
        rp = PyUnicode_AsUTF8AndSize(reply, &rn);
        if (rp == NULL) {
            PyErr_Clear();
            break;
        }
        if (!reply_numbers(rp, rn, nums) || nums[0] > 1)
            break;  /* a redelivery (a receive count), or numbers the Python reading reads */
        dp = (const unsigned char *)PyBytes_AS_STRING(data);
        dn = PyBytes_GET_SIZE(data);
        if (!read_head(dp, dn, &enq, &names_end, &pa, &lp))
            break;
        namekey = PyBytes_FromStringAndSize((const char *)dp + 9, names_end - 9);
        if (namekey == NULL) {
            failed = 1;
            break;
        }
        four = PyDict_GetItemWithError(names, namekey);
        Py_DECREF(namekey);
        if (four == NULL || !PyTuple_CheckExact(four) || PyTuple_GET_SIZE(four) != 4) {
            if (PyErr_Occurred())
                failed = 1;
            break;  /* names not seen yet: stored_message reads and keeps them */
        }
        propkey = PyBytes_FromStringAndSize((const char *)dp + pa, lp);
        if (propkey == NULL) {
            failed = 1;
            break;
        }
        pr = PyDict_GetItemWithError(props, propkey);
        Py_DECREF(propkey);
        if (pr == NULL) {
            if (PyErr_Occurred())
                failed = 1;
            break;
        }
        /* taken here from now on: what the Python loop body does, in its order */
        if (nums[1] > last_delivery) {
            PyObject *pend = PyLong_FromLongLong(nums[2]);
            if (pend == NULL) {
                failed = 1;
                break;
            }
            last_delivery = nums[1];
            Py_XSETREF(last_pending, pend);
        }
        if (PyDict_GET_SIZE(delays)) {
            r = PyObject_CallMethod(delays, "pop", "OO", msg_id, Py_None);
            if (r == NULL) {
                failed = 1;
                break;
            }
            Py_DECREF(r);
        }
        Py_INCREF(four);
        Py_INCREF(pr);
        enq_obj = PyFloat_FromDouble(enq);
        body = enq_obj == NULL ? NULL : PyBytes_FromStringAndSize((const char *)dp + pa + lp, dn - pa - lp);
        if (body == NULL)
            msg = NULL;
        else if (new_message == object_new && PyType_Check(cls)
                 && ((PyTypeObject *)cls)->tp_new == PyBaseObject_Type.tp_new)
            /* object.__new__(cls) without its wrapper's argument tuple and checks (~1.2k
               instructions a call): object's own tp_new, as that wrapper calls it */
            msg = PyBaseObject_Type.tp_new((PyTypeObject *)cls, empty, NULL);
        else
            msg = PyObject_CallOneArg(new_message, cls);
        if (msg != NULL) {
            callargs[0] = msg;
            callargs[1] = body;
            callargs[2] = pr;
            callargs[3] = PyTuple_GET_ITEM(four, 2);
            callargs[4] = PyTuple_GET_ITEM(four, 3);
            callargs[5] = enq_obj;
            callargs[6] = empty;
            callargs[7] = msg_id;
            r = PyObject_Vectorcall(init, callargs, 8, NULL);
            if (r == NULL)
                Py_CLEAR(msg);
            else
                Py_DECREF(r);
        }
        Py_DECREF(four);
        Py_DECREF(pr);
        if (msg == NULL || PyDict_SetItem(leases, msg_id, m) < 0) {
            Py_XDECREF(msg);
            Py_XDECREF(body);
            Py_XDECREF(enq_obj);
            failed = 1;
            break;
        }
        {
            PyObject *size = PyLong_FromSsize_t(PyBytes_GET_SIZE(body));
            if (size == NULL) {
                r = NULL;
            }
            else {
                callargs[0] = msg;
                callargs[1] = size;
                callargs[2] = now;
                callargs[3] = msg_id;
                callargs[4] = enq_obj;
                r = PyObject_Vectorcall(restore, callargs, 5, NULL);
                Py_DECREF(size);
            }
        }
        Py_DECREF(msg);
        Py_DECREF(body);
        Py_DECREF(enq_obj);
        if (r != NULL) {
            Py_DECREF(r);
            continue;
        }
        /* JetStream's delivery of a message leased here already (Q3): the newer lease */
        if (PyErr_ExceptionMatches(cmq_error)) {
            PyObject *et, *ev, *etb, *rule;
            int q3;
            PyErr_Fetch(&et, &ev, &etb);
            PyErr_NormalizeException(&et, &ev, &etb);
            rule = ev == NULL ? NULL : PyObject_GetAttrString(ev, "rule");
            q3 = rule != NULL && PyUnicode_Check(rule) && PyUnicode_CompareWithASCIIString(rule, "Q3") == 0;
            Py_XDECREF(rule);
            if (q3) {
                PyErr_Clear();
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(etb);
                continue;
            }
            PyErr_Restore(et, ev, etb);
        }
        failed = 1;
        break;
    }
    Py_DECREF(empty);
    {
        /* s.last_delivery as far as taken, also when an error stops the run (as the Python
           loop leaves it) */
        PyObject *et, *ev, *etb, *v;
        int set;
        PyErr_Fetch(&et, &ev, &etb);
        v = PyLong_FromLongLong(last_delivery);
        set = v != NULL && PyObject_SetAttrString(s, "last_delivery", v) == 0;
        Py_XDECREF(v);
        if (failed) {
            if (!set)
                PyErr_Clear();
            PyErr_Restore(et, ev, etb);
            Py_XDECREF(last_pending);
            return NULL;
        }
        if (!set) {
            Py_XDECREF(last_pending);
            return NULL;
        }
    }
    out = PyTuple_New(2);
    if (out == NULL) {
        Py_XDECREF(last_pending);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, PyLong_FromSsize_t(i));
    if (PyTuple_GET_ITEM(out, 0) == NULL) {
        Py_DECREF(out);
        Py_XDECREF(last_pending);
        return NULL;
    }
    if (last_pending == NULL) {
        Py_INCREF(Py_None);
        last_pending = Py_None;
    }
    PyTuple_SET_ITEM(out, 1, last_pending);
    return out;
}

/* ack_pubs(replies) -> commands: wire.pubs(replies), the reference, made here for a list of
   (str subject, bytes payload): (b"PUB <subject> <len>\r\n<payload>\r\n", subject, "",
   payload, None) each. None when an item is anything else or a subject is not ASCII
   (wire.pubs makes them). The list comprehension's encode and concatenations were ~1k
   instructions an ack (callgrind, issue 28). */
static PyObject *
ack_pubs(PyObject *self, PyObject *replies)
{
    Py_ssize_t i, n;
    PyObject *out, *empty;
    if (!PyList_Check(replies)) {
        PyErr_SetString(PyExc_TypeError, "ack_pubs(replies: list)");
        return NULL;
    }
    n = PyList_GET_SIZE(replies);
    for (i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(replies, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(t, 0))
                || !PyUnicode_IS_ASCII(PyTuple_GET_ITEM(t, 0)) || !PyBytes_CheckExact(PyTuple_GET_ITEM(t, 1)))
            Py_RETURN_NONE;
    }
    empty = PyUnicode_New(0, 0);
    if (empty == NULL)
        return NULL;
    out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(empty);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(replies, i), *subject = PyTuple_GET_ITEM(t, 0), *payload = PyTuple_GET_ITEM(t, 1);
        PyObject *cmd, *item;
        Py_ssize_t sn = PyUnicode_GET_LENGTH(subject), bn = PyBytes_GET_SIZE(payload);
        char lens[24];
        int ln;
        char *w;
        ln = put_decimal(lens, (unsigned long long)bn);
        cmd = PyBytes_FromStringAndSize(NULL, 4 + sn + 1 + ln + 2 + bn + 2);
        item = cmd == NULL ? NULL : PyTuple_New(5);
        if (item == NULL) {
            Py_XDECREF(cmd);
            Py_DECREF(out);
            Py_DECREF(empty);
            return NULL;
        }
        w = PyBytes_AS_STRING(cmd);
        memcpy(w, "PUB ", 4); w += 4;
        memcpy(w, PyUnicode_DATA(subject), (size_t)sn); w += sn;
        *w++ = ' ';
        memcpy(w, lens, (size_t)ln); w += ln;
        memcpy(w, "\r\n", 2); w += 2;
        memcpy(w, PyBytes_AS_STRING(payload), (size_t)bn); w += bn;
        memcpy(w, "\r\n", 2);
        PyTuple_SET_ITEM(item, 0, cmd);
        Py_INCREF(subject);
        PyTuple_SET_ITEM(item, 1, subject);
        Py_INCREF(empty);
        PyTuple_SET_ITEM(item, 2, empty);
        Py_INCREF(payload);
        PyTuple_SET_ITEM(item, 3, payload);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(item, 4, Py_None);
        PyList_SET_ITEM(out, i, item);
    }
    Py_DECREF(empty);
    return out;
}

static PyMethodDef methods[] = {
    {"take_lone", (PyCFunction)(void (*)(void))take_lone, METH_FASTCALL,
     "take_lone(data, pos, sid, delivery, key, out) -> pos"},
    {"take_plain", (PyCFunction)(void (*)(void))take_plain, METH_FASTCALL,
     "take_plain(data, pos, sid, out) -> pos"},
    {"ack_numbers", (PyCFunction)ack_numbers, METH_O,
     "ack_numbers(reply) -> (delivered, consumer seq, pending) | None"},
    {"hpub_run", (PyCFunction)(void (*)(void))hpub_run, METH_FASTCALL,
     "hpub_run(outbox, writes, sent, again, prefix, now, max_sent, max_batch, batch, commands)"},
    {"stored_run", (PyCFunction)(void (*)(void))stored_run, METH_FASTCALL,
     "stored_run(replies, i, writes, sent, again, settled, out) -> i"},
    {"stored_lsn", (PyCFunction)(void (*)(void))stored_lsn, METH_FASTCALL,
     "stored_lsn(subject, data) -> lsn | None"},
    {"message_head", (PyCFunction)message_head, METH_O,
     "message_head(raw) -> (enqueue time, names, properties, body start) | None"},
    {"take_plains", (PyCFunction)(void (*)(void))take_plains, METH_FASTCALL,
     "take_plains(msgs, i, s, now, leases, delays, restore_plain, names, props, new_message, init_message, "
     "message_cls, cmq_error, key) -> (i, pending | None)"},
    {"ack_pubs", (PyCFunction)ack_pubs, METH_O, "ack_pubs(replies) -> commands | None"},
    {"hpub_lsn", (PyCFunction)(void (*)(void))hpub_lsn, METH_FASTCALL,
     "hpub_lsn(subject, prefix, lsn, headers, payload) -> (command, subject, reply, payload, headers) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire", "Runs of NATS messages of one subscription read in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    return PyModule_Create(&module);
}
