/* The two frames of every message, in C: a hand-written measured hot path (issue 15).
 *
 * Why by hand: no maintained library parses AMQP 0-9-1 frames for a server in C (pamqp, the
 * wire types, is pure Python), and these few functions were a fifth of the event loop's CPU
 * per message in scenario 1 (a publish cost 3.8 us to take out of the buffer, an ack 1.5 us,
 * a delivery ~1.5 us to encode: scripts/bench_pipeline.py, 19.3 us a message in all).
 *
 * The contract is gateway.protocol.fastpath's pure-Python twins, which run where this module
 * is not built; tests/unit/protocol/test_fastpath.py holds the two to the same results on
 * random and damaged input. Anything that is not the plain case returns None, and the
 * caller's general path (which has every error reply) takes the frame instead.
 *
 *   fast_event(buf, pos, frame_max, max_message_size, channels)
 *       -> (event, next_pos) | None
 *   append_deliver(out, channel, consumer_tag, delivery_tag, redelivered, exchange,
 *                  routing_key, properties, body, frame_max) -> None
 *   ack_run(buf, pos, channel, frame_max, limit) -> [delivery_tag, ...] | None
 *   configure(...) once at import: the event classes, the shared caches, ChannelState.OPEN.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_END 0xCE
#define NAMES_MAX 4096
#define SCANNED_MAX 4096

static PyObject *Content_t, *Method_t, *Publish_t, *Ack_t, *Properties_t;
static PyObject *names;    /* codec._NAMES: bytes -> str, shared with the Python path */
static PyObject *scanned;  /* properties._SCANNED: raw -> (raw, flags, spans, templates) */
static PyObject *chan_open;  /* ChannelState.OPEN */
static PyObject *empty_tuple;

static PyObject *s_channel, *s_method, *s_properties, *s_body, *s_ticket, *s_exchange,
    *s_routing_key, *s_mandatory, *s_immediate, *s_delivery_tag, *s_multiple, *s_raw,
    *s_flags, *s_spans, *s_templates, *s_cache, *s_state, *s_publish;

static inline uint16_t u16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t u64(const unsigned char *p) { return ((uint64_t)u32(p) << 32) | u32(p + 4); }
static inline void put16(unsigned char *p, uint16_t v) { p[0] = v >> 8; p[1] = v & 0xFF; }
static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = (v >> 16) & 0xFF; p[2] = (v >> 8) & 0xFF; p[3] = v & 0xFF;
}
static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }

/* A new instance of a slotted class without running its __init__ (as cls.__new__(cls)). */
static PyObject *bare(PyObject *cls) {
    PyTypeObject *t = (PyTypeObject *)cls;
    return t->tp_new(t, empty_tuple, NULL);
}

/* Where a class keeps one of its __slots__, remembered per call site. Why: the 18 slots a
 * publish and an ack fill went through PyObject_GenericSetAttr (the type's MRO lookup, the
 * member descriptor, PyMember_SetOne: ~130 instructions each, ~2.4k of a scenario-1 message).
 * The offset is the member descriptor's, used only while the type's version tag is the one it
 * was read under (any change to the class or its bases resets the tag, as it does for
 * CPython's own attribute caches); a name that is not a plain object slot takes the generic
 * call, so the result is always what the generic call would do. */
typedef struct {
    PyTypeObject *type;  /* strong: an address is never reused while cached */
    unsigned int version;
    Py_ssize_t offset;   /* 0: not a writable object slot (the generic call) */
} SlotCache;

static Py_ssize_t slot_lookup(PyTypeObject *t, PyObject *name, SlotCache *c) {
    PyObject *d = _PyType_Lookup(t, name);  /* borrowed; assigns the type a version tag */
    Py_ssize_t off = 0;
    if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDescrObject *md = (PyMemberDescrObject *)d;
        if (md->d_member->type == T_OBJECT_EX && !(md->d_member->flags & READONLY)
            && PyType_IsSubtype(t, PyDescr_TYPE(md)))
            off = md->d_member->offset;
    }
    Py_INCREF(t);
    Py_XSETREF(c->type, t);
    c->version = t->tp_version_tag;
    c->offset = off;
    return off;
}

static inline Py_ssize_t slot_offset(PyTypeObject *t, PyObject *name, SlotCache *c) {
    if (c->type == t && c->version != 0 && t->tp_version_tag == c->version) return c->offset;
    return slot_lookup(t, name, c);
}

/* PyObject_GenericSetAttr(obj, name, value) for a value that is not NULL. */
static inline int slot_set(PyObject *obj, PyObject *name, SlotCache *c, PyObject *value) {
    Py_ssize_t off = slot_offset(Py_TYPE(obj), name, c);
    if (off == 0) return PyObject_GenericSetAttr(obj, name, value);
    PyObject **at = (PyObject **)((char *)obj + off);
    PyObject *old = *at;
    *at = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

/* PyObject_GetAttr(obj, name) of a slot (a new reference; an empty slot raises as there). */
static PyObject *slot_get(PyObject *obj, PyObject *name, SlotCache *c) {
    if (Py_TYPE(obj)->tp_getattro != PyObject_GenericGetAttr) return PyObject_GetAttr(obj, name);
    Py_ssize_t off = slot_offset(Py_TYPE(obj), name, c);
    PyObject *v = off ? *(PyObject **)((char *)obj + off) : NULL;
    if (v == NULL) return PyObject_GetAttr(obj, name);
    return Py_NewRef(v);
}

/* The call sites' caches, one a (class, slot) pair. */
enum { C_PROPS_RAW, C_PROPS_FLAGS, C_PROPS_SPANS, C_PROPS_TEMPLATES, C_PROPS_CACHE, C_CHAN_STATE,
       C_CHAN_PUBLISH, C_ACK_TAG, C_ACK_MULTIPLE, C_METHOD_CHANNEL, C_METHOD_METHOD, C_PUB_TICKET,
       C_PUB_EXCHANGE, C_PUB_KEY, C_PUB_MANDATORY, C_PUB_IMMEDIATE, C_CONTENT_CHANNEL, C_CONTENT_METHOD,
       C_CONTENT_PROPS, C_CONTENT_BODY, N_CACHES };
static SlotCache caches[N_CACHES];

/* Set a slot; steals ``value`` (which may be NULL after a failed call: then fails). */
static int set_steal(PyObject *obj, PyObject *name, SlotCache *c, PyObject *value) {
    if (value == NULL) return -1;
    int rc = slot_set(obj, name, c, value);
    Py_DECREF(value);
    return rc;
}

/* The last name (or property list) a call site took, and what it gave: a publisher sends the
 * same exchange, routing key and properties message after message, and each lookup made a
 * bytes object, hashed it (siphash), looked it up and freed it (~250 instructions, three a
 * publish). A hit gives what the lookup gave for the same bytes. */
typedef struct {
    Py_ssize_t len;  /* -1: empty */
    unsigned char data[256];
    PyObject *value;  /* strong */
} LastName;

static LastName last_exchange = {-1, {0}, NULL}, last_routing_key = {-1, {0}, NULL};
static PyObject *last_props_raw, *last_props_known;  /* properties_of's: raw bytes, its _SCANNED entry */

static inline PyObject *last_hit(LastName *c, const unsigned char *p, Py_ssize_t n) {
    if (c->len == n && memcmp(c->data, p, n) == 0) return Py_NewRef(c->value);
    return NULL;
}

static void last_keep(LastName *c, const unsigned char *p, Py_ssize_t n, PyObject *value) {
    if (n > (Py_ssize_t)sizeof c->data) return;
    Py_XSETREF(c->value, Py_NewRef(value));
    memcpy(c->data, p, n);
    c->len = n;
}

static void forget_last(void) {
    last_exchange.len = last_routing_key.len = -1;
    Py_CLEAR(last_exchange.value);
    Py_CLEAR(last_routing_key.value);
    Py_CLEAR(last_props_raw);
    Py_CLEAR(last_props_known);
}

/* codec._name: one str per distinct name; NULL with no error set when not UTF-8. */
static PyObject *name_uncached(const unsigned char *p, Py_ssize_t n);

static PyObject *name_of(const unsigned char *p, Py_ssize_t n, LastName *c) {
    PyObject *name = last_hit(c, p, n);
    if (name != NULL) return name;
    name = name_uncached(p, n);
    if (name != NULL) last_keep(c, p, n, name);
    return name;
}

static PyObject *name_uncached(const unsigned char *p, Py_ssize_t n) {
    PyObject *raw = PyBytes_FromStringAndSize((const char *)p, n);
    if (raw == NULL) return NULL;
    PyObject *name = PyDict_GetItemWithError(names, raw);
    if (name != NULL) {
        Py_DECREF(raw);
        Py_INCREF(name);
        return name;
    }
    if (PyErr_Occurred()) { Py_DECREF(raw); return NULL; }
    name = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (name == NULL) {
        Py_DECREF(raw);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
        return NULL;
    }
    if (PyDict_GET_SIZE(names) >= NAMES_MAX) PyDict_Clear(names);
    int rc = PyDict_SetItem(names, raw, name);
    Py_DECREF(raw);
    if (rc < 0) { Py_DECREF(name); return NULL; }
    return name;
}

/* Properties(raw) with the scan shared through _SCANNED, as Properties.__init__ does; NULL
 * with no error set when the property list is malformed (the general path replies). */
static PyObject *properties_of(const unsigned char *p, Py_ssize_t n) {
    PyObject *known;
    if (last_props_raw != NULL && PyBytes_GET_SIZE(last_props_raw) == n
        && memcmp(PyBytes_AS_STRING(last_props_raw), p, n) == 0) {
        known = Py_NewRef(last_props_known);  /* the entry _SCANNED gave for these bytes */
    } else {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)p, n);
        if (raw == NULL) return NULL;
        known = PyDict_GetItemWithError(scanned, raw);
        if (known == NULL) {
            if (PyErr_Occurred()) { Py_DECREF(raw); return NULL; }
            /* First sight of these bytes: the Python constructor scans them and fills the cache. */
            PyObject *props = PyObject_CallOneArg(Properties_t, raw);
            Py_DECREF(raw);
            if (props == NULL && (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_IndexError)))
                PyErr_Clear();
            return props;
        }
        Py_DECREF(raw);
        if (!PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 4) {
            PyErr_SetString(PyExc_TypeError, "_SCANNED holds (raw, flags, spans, templates)");
            return NULL;
        }
        /* Held: the allocation below may run the collector, and a finalizer could make a
         * Properties that clears the cache this entry is borrowed from. */
        Py_INCREF(known);
        if (PyBytes_CheckExact(PyTuple_GET_ITEM(known, 0))) {  /* its raw: these bytes */
            Py_XSETREF(last_props_raw, Py_NewRef(PyTuple_GET_ITEM(known, 0)));
            Py_XSETREF(last_props_known, Py_NewRef(known));
        }
    }
    PyObject *props = bare(Properties_t);
    if (props != NULL) {
        PyObject *const *k = &PyTuple_GET_ITEM(known, 0);
        if (slot_set(props, s_raw, &caches[C_PROPS_RAW], k[0]) < 0
            || slot_set(props, s_flags, &caches[C_PROPS_FLAGS], k[1]) < 0
            || slot_set(props, s_spans, &caches[C_PROPS_SPANS], k[2]) < 0
            || slot_set(props, s_templates, &caches[C_PROPS_TEMPLATES], k[3]) < 0
            || slot_set(props, s_cache, &caches[C_PROPS_CACHE], Py_None) < 0)
            Py_CLEAR(props);
    }
    Py_DECREF(known);
    return props;
}

/* 1: the channel is open and not in the middle of a content; 0: not; -1: error. */
static int channel_takes(PyObject *channels, unsigned channel) {
    PyObject *key = PyLong_FromUnsignedLong(channel);
    if (key == NULL) return -1;
    PyObject *chan = PyDict_GetItemWithError(channels, key);
    Py_DECREF(key);
    if (chan == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(chan);
    PyObject *state = slot_get(chan, s_state, &caches[C_CHAN_STATE]);
    if (state == NULL) { Py_DECREF(chan); return -1; }
    int ok = state == chan_open;
    Py_DECREF(state);
    if (ok) {
        PyObject *publish = slot_get(chan, s_publish, &caches[C_CHAN_PUBLISH]);
        if (publish == NULL) { Py_DECREF(chan); return -1; }
        ok = publish == Py_None;
        Py_DECREF(publish);
    }
    Py_DECREF(chan);
    return ok;
}

static PyObject *pair(PyObject *event, Py_ssize_t next_pos) {
    if (event == NULL) return NULL;
    PyObject *at = PyLong_FromSsize_t(next_pos);
    if (at == NULL) { Py_DECREF(event); return NULL; }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) { Py_DECREF(event); Py_DECREF(at); return NULL; }
    PyTuple_SET_ITEM(out, 0, event);
    PyTuple_SET_ITEM(out, 1, at);
    return out;
}

static PyObject *make_ack(unsigned channel, uint64_t tag, int multiple, Py_ssize_t next_pos) {
    PyObject *ack = bare(Ack_t);
    if (ack == NULL) return NULL;
    if (set_steal(ack, s_delivery_tag, &caches[C_ACK_TAG], PyLong_FromUnsignedLongLong(tag)) < 0
        || slot_set(ack, s_multiple, &caches[C_ACK_MULTIPLE], multiple ? Py_True : Py_False) < 0) {
        Py_DECREF(ack);
        return NULL;
    }
    PyObject *event = bare(Method_t);
    if (event == NULL || set_steal(event, s_channel, &caches[C_METHOD_CHANNEL], PyLong_FromUnsignedLong(channel)) < 0
        || slot_set(event, s_method, &caches[C_METHOD_METHOD], ack) < 0) {
        Py_XDECREF(event);
        Py_DECREF(ack);
        return NULL;
    }
    Py_DECREF(ack);  /* the event holds it */
    return pair(event, next_pos);
}

/* fastpath._frame_at: 1 and the payload's start and end when the frame of this type and
 * channel at ``pos`` is all buffered, within frame_max and well-ended; 0 otherwise. */
static int frame_at(const unsigned char *d, Py_ssize_t n, Py_ssize_t pos, unsigned ftype, unsigned channel,
                    unsigned long long frame_max, Py_ssize_t *start, Py_ssize_t *end) {
    if (n - pos < 7) return 0;
    Py_ssize_t size = u32(d + pos + 3);
    *start = pos + 7;
    *end = *start + size;
    return d[pos] == ftype && u16(d + pos + 1) == channel && *end < n
           && !(frame_max && (unsigned long long)size > frame_max) && d[*end] == FRAME_END;
}

/* The publish whose method frame's payload is ``start``..``end`` (all in the buffer; its end
 * octet is checked here), with its content header and single body frame; returns the pair,
 * Py_None (new ref) to decline, NULL on error. */
static PyObject *take_publish(const unsigned char *d, Py_ssize_t n, unsigned channel, Py_ssize_t start,
                              Py_ssize_t end, unsigned long long frame_max, unsigned long long max_size,
                              PyObject *channels) {
    if (d[end] != FRAME_END) Py_RETURN_NONE;
    Py_ssize_t hstart, hend;
    if (!frame_at(d, n, end + 1, FRAME_HEADER, channel, frame_max, &hstart, &hend) || hend - hstart < 14)
        Py_RETURN_NONE;
    uint64_t body_size = u64(d + hstart + 4);
    if (u16(d + hstart) != 60 || u16(d + hstart + 2) != 0 || body_size > max_size) Py_RETURN_NONE;
    Py_ssize_t bstart = hend, bend = hend;
    if (body_size && (!frame_at(d, n, hend + 1, FRAME_BODY, channel, frame_max, &bstart, &bend)
                      || (uint64_t)(bend - bstart) != body_size))
        Py_RETURN_NONE;
    /* basic.publish: ticket, exchange, routing key (short strings), then one octet of bits,
     * ending exactly at the frame's end. */
    Py_ssize_t p = start + 4;
    if (end - p < 5) Py_RETURN_NONE;
    unsigned ticket = u16(d + p);
    p += 2;
    Py_ssize_t xn = d[p], xat = p + 1;
    p = xat + xn;
    if (p >= end) Py_RETURN_NONE;
    Py_ssize_t rn = d[p], rat = p + 1;
    p = rat + rn;
    if (p + 1 != end) Py_RETURN_NONE;
    unsigned bits = d[p];

    int takes = channel_takes(channels, channel);
    if (takes <= 0) {
        if (takes < 0) return NULL;
        Py_RETURN_NONE;
    }
    /* Every byte is copied out before Properties' first scan of new bytes runs Python code. */
    PyObject *body = NULL, *exchange = NULL, *routing_key = NULL, *props = NULL, *method = NULL, *event = NULL,
             *number = NULL, *result = NULL;
    body = PyBytes_FromStringAndSize(body_size ? (const char *)d + bstart : NULL, bend - bstart);
    if (body == NULL) goto done;
    exchange = name_of(d + xat, xn, &last_exchange);
    if (exchange == NULL) goto done;
    routing_key = name_of(d + rat, rn, &last_routing_key);
    if (routing_key == NULL) goto done;
    props = properties_of(d + hstart + 12, hend - hstart - 12);
    if (props == NULL) goto done;
    number = PyLong_FromUnsignedLong(channel);
    if (number == NULL) goto done;
    method = bare(Publish_t);
    if (method == NULL) goto done;
    if (set_steal(method, s_ticket, &caches[C_PUB_TICKET], PyLong_FromUnsignedLong(ticket)) < 0
        || slot_set(method, s_exchange, &caches[C_PUB_EXCHANGE], exchange) < 0
        || slot_set(method, s_routing_key, &caches[C_PUB_KEY], routing_key) < 0
        || slot_set(method, s_mandatory, &caches[C_PUB_MANDATORY], (bits & 1) ? Py_True : Py_False) < 0
        || slot_set(method, s_immediate, &caches[C_PUB_IMMEDIATE], (bits & 2) ? Py_True : Py_False) < 0)
        goto done;
    event = bare(Content_t);
    if (event == NULL) goto done;
    if (slot_set(event, s_channel, &caches[C_CONTENT_CHANNEL], number) < 0
        || slot_set(event, s_method, &caches[C_CONTENT_METHOD], method) < 0
        || slot_set(event, s_properties, &caches[C_CONTENT_PROPS], props) < 0
        || slot_set(event, s_body, &caches[C_CONTENT_BODY], body) < 0)
        goto done;
    Py_INCREF(event);
    result = pair(event, bend + 1);
done:
    Py_XDECREF(body); Py_XDECREF(exchange); Py_XDECREF(routing_key); Py_XDECREF(props);
    Py_XDECREF(number); Py_XDECREF(method); Py_XDECREF(event);
    if (result == NULL && !PyErr_Occurred()) Py_RETURN_NONE;  /* declined: not UTF-8, bad properties */
    return result;
}

/* The octets of a bytes or bytearray read buffer; 0 for anything else (declined). */
static inline int bytes_of(PyObject *buf, const unsigned char **d, Py_ssize_t *n) {
    if (PyBytes_CheckExact(buf)) {
        *d = (const unsigned char *)PyBytes_AS_STRING(buf);
        *n = PyBytes_GET_SIZE(buf);
    } else if (PyByteArray_CheckExact(buf)) {
        *d = (const unsigned char *)PyByteArray_AS_STRING(buf);
        *n = PyByteArray_GET_SIZE(buf);
    } else {
        return 0;
    }
    return 1;
}

static PyObject *fast_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "fast_event(buf, pos, frame_max, max_message_size, channels)");
        return NULL;
    }
    if (Content_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_frames.configure() was not called");
        return NULL;
    }
    const unsigned char *d;
    Py_ssize_t n;
    if (!bytes_of(args[0], &d, &n)) Py_RETURN_NONE;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    unsigned long long frame_max = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long max_size = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *channels = args[4];
    if (!PyDict_Check(channels)) {
        PyErr_SetString(PyExc_TypeError, "channels must be a dict");
        return NULL;
    }
    if (pos < 0 || n - pos < 11) Py_RETURN_NONE;
    unsigned ftype = d[pos], channel = u16(d + pos + 1);
    Py_ssize_t size = u32(d + pos + 3);
    if (ftype != FRAME_METHOD || channel == 0 || size < 4) Py_RETURN_NONE;
    if (frame_max && (unsigned long long)size > frame_max) Py_RETURN_NONE;
    if (n - pos < size + 8) Py_RETURN_NONE;
    Py_ssize_t start = pos + 7, end = start + size;
    uint32_t index = u32(d + start);
    if (index == ((60u << 16) | 40u))
        return take_publish(d, n, channel, start, end, frame_max, max_size, channels);
    if (index == ((60u << 16) | 80u) && size == 13 && d[end] == FRAME_END) {
        int takes = channel_takes(channels, channel);
        if (takes <= 0) {
            if (takes < 0) return NULL;
            Py_RETURN_NONE;
        }
        return make_ack(channel, u64(d + start + 4), d[start + 12] & 1, end + 1);
    }
    Py_RETURN_NONE;
}

/* ack_run(buf, pos, channel, frame_max, limit) -> [tag, ...] | None: the delivery tags of the
 * basic.ack frames with multiple=false at ``pos`` and after it, back to back on ``channel``,
 * each whole and well-ended (ACK_FRAME octets: fast_event's ack), at most ``limit``; None
 * when the frame at ``pos`` is not one. Why: a consumer's acks come in runs (one per
 * delivery it read), and each took its own turn of the transport's read loop, its own event
 * objects and Session.on_event's frame (gateway/transport.py takes a run in one call). */
#define ACK_FRAME 21
static PyObject *ack_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "ack_run(buf, pos, channel, frame_max, limit)");
        return NULL;
    }
    const unsigned char *d;
    Py_ssize_t n;
    if (!bytes_of(args[0], &d, &n)) Py_RETURN_NONE;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long channel = PyLong_AsLong(args[2]);
    unsigned long long frame_max = PyLong_AsUnsignedLongLong(args[3]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (pos < 0 || channel <= 0 || channel > 0xFFFF || (frame_max && frame_max < 13)) Py_RETURN_NONE;
    Py_ssize_t count = 0;
    for (Py_ssize_t p = pos; count < limit && n - p >= ACK_FRAME; p += ACK_FRAME, count++) {
        const unsigned char *f = d + p;
        if (f[0] != FRAME_METHOD || u16(f + 1) != channel || u32(f + 3) != 13
            || u32(f + 7) != ((60u << 16) | 80u) || (f[19] & 1) || f[20] != FRAME_END)
            break;
    }
    if (!count) Py_RETURN_NONE;
    PyObject *tags = PyList_New(count);
    if (tags == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *tag = PyLong_FromUnsignedLongLong(u64(d + pos + i * ACK_FRAME + 11));
        if (tag == NULL) { Py_DECREF(tags); return NULL; }
        PyList_SET_ITEM(tags, i, tag);
    }
    return tags;
}

/* The UTF-8 of a str (cached by CPython in the object) or a bytes' own data. */
static int short_string(PyObject *value, const char **data, Py_ssize_t *n) {
    if (PyUnicode_Check(value)) {
        *data = PyUnicode_AsUTF8AndSize(value, n);
        if (*data == NULL) return -1;
    } else if (PyBytes_Check(value)) {
        *data = PyBytes_AS_STRING(value);
        *n = PyBytes_GET_SIZE(value);
    } else {
        PyErr_SetString(PyExc_TypeError, "a short string is a str or bytes");
        return -1;
    }
    if (*n > 255) {
        PyErr_Format(PyExc_ValueError, "short string of %zd bytes (max 255)", *n);
        return -1;
    }
    return 0;
}

static PyObject *append_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "append_deliver(out, channel, consumer_tag, delivery_tag, "
                                         "redelivered, exchange, routing_key, properties, body, frame_max)");
        return NULL;
    }
    PyObject *out = args[0];
    if (!PyByteArray_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a bytearray");
        return NULL;
    }
    unsigned long channel = PyLong_AsUnsignedLong(args[1]);
    unsigned long long tag = PyLong_AsUnsignedLongLong(args[3]);
    long long frame_max = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (channel > 0xFFFF) {
        PyErr_SetString(PyExc_OverflowError, "channel above 65535");
        return NULL;
    }
    int redelivered = PyObject_IsTrue(args[4]);
    if (redelivered < 0) return NULL;
    const char *ctag, *exch, *rkey;
    Py_ssize_t ctag_n, exch_n, rkey_n;
    if (short_string(args[2], &ctag, &ctag_n) < 0 || short_string(args[5], &exch, &exch_n) < 0
        || short_string(args[6], &rkey, &rkey_n) < 0)
        return NULL;
    Py_buffer props, body;
    if (PyObject_GetBuffer(args[7], &props, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[8], &body, PyBUF_SIMPLE) < 0) { PyBuffer_Release(&props); return NULL; }
    Py_ssize_t bn = body.len;
    Py_ssize_t chunk = frame_max > 8 ? (Py_ssize_t)frame_max - 8 : bn;
    if (chunk <= 0) chunk = bn ? bn : 1;
    Py_ssize_t pieces = bn ? (bn + chunk - 1) / chunk : 0;
    Py_ssize_t method_size = 4 + 1 + ctag_n + 9 + 1 + exch_n + 1 + rkey_n;
    Py_ssize_t need = (7 + method_size + 1) + (7 + 12 + props.len + 1) + pieces * 8 + bn;
    if (props.len > 0xFFFFFFFFLL - 12 || method_size > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "frame payload over 4 GiB");
        goto fail;
    }
    Py_ssize_t at = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, at + need) < 0) goto fail;
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(out) + at;
    /* basic.deliver (60, 60): consumer tag, delivery tag, redelivered, exchange, routing key */
    w[0] = FRAME_METHOD; put16(w + 1, (uint16_t)channel); put32(w + 3, (uint32_t)method_size);
    put16(w + 7, 60); put16(w + 9, 60);
    w += 11;
    *w++ = (unsigned char)ctag_n; memcpy(w, ctag, ctag_n); w += ctag_n;
    put64(w, tag); w[8] = redelivered ? 1 : 0; w += 9;
    *w++ = (unsigned char)exch_n; memcpy(w, exch, exch_n); w += exch_n;
    *w++ = (unsigned char)rkey_n; memcpy(w, rkey, rkey_n); w += rkey_n;
    *w++ = FRAME_END;
    /* content header: class 60, weight 0, body size, property list */
    w[0] = FRAME_HEADER; put16(w + 1, (uint16_t)channel); put32(w + 3, (uint32_t)(12 + props.len));
    put16(w + 7, 60); put16(w + 9, 0); put64(w + 11, (uint64_t)bn);
    w += 19;
    memcpy(w, props.buf, props.len); w += props.len;
    *w++ = FRAME_END;
    for (Py_ssize_t off = 0; off < bn; off += chunk) {
        Py_ssize_t len = bn - off < chunk ? bn - off : chunk;
        w[0] = FRAME_BODY; put16(w + 1, (uint16_t)channel); put32(w + 3, (uint32_t)len);
        w += 7;
        memcpy(w, (const char *)body.buf + off, len); w += len;
        *w++ = FRAME_END;
    }
    PyBuffer_Release(&props);
    PyBuffer_Release(&body);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&props);
    PyBuffer_Release(&body);
    return NULL;
}

/* tuple_of(cls, *items): tuple.__new__(cls, items) for a tuple class, without the argument
 * tuple, the items' tuple and tuple.__new__'s copy of it (tp_new_wrapper, tuple_subtype_new:
 * four tuples for one; the broker makes one Unacked a delivery). The same object: the
 * class's tp_alloc, the items in order. */
static PyObject *tuple_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "tuple_of(cls, *items): cls is tuple or a subclass of it");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)args[0];
    Py_ssize_t n = nargs - 1;
    PyObject *out = t == &PyTuple_Type ? PyTuple_New(n) : t->tp_alloc(t, n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(out, i, Py_NewRef(args[i + 1]));
    return out;
}

/* tuple_new(cls, items): tuple.__new__(cls, items), called as a METH_FASTCALL function, not
 * through tp_new_wrapper (its argument tuple, slice and subtype checks: ~0.5k instructions;
 * semantics' CmqQueue makes one Receipt a delivery this way). The same object as
 * tuple_subtype_new makes: the items' tuple (items itself when it is one) copied into the
 * class's tp_alloc; tuple itself gets that tuple. */
static PyObject *tuple_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "tuple_new(cls, items): cls is tuple or a subclass of it");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)args[0];
    PyObject *items = PySequence_Tuple(args[1]);  /* a new reference; items itself for an exact tuple */
    if (items == NULL || t == &PyTuple_Type) return items;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *out = t->tp_alloc(t, n);
    if (out != NULL)
        for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(items, i)));
    Py_DECREF(items);
    return out;
}

/* object_new(cls): object.__new__(cls) for a class that takes object's __new__ (no __new__
 * of its own, not abstract), as a METH_O function rather than through tp_new_wrapper:
 * object_new's own step, the class's tp_alloc (semantics' QueueMessage, one a message a
 * queue). Any other class is refused (TypeError), never made differently. */
static PyObject *object_new(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls) || ((PyTypeObject *)cls)->tp_new != PyBaseObject_Type.tp_new
            || PyType_HasFeature((PyTypeObject *)cls, Py_TPFLAGS_IS_ABSTRACT)) {
        PyErr_SetString(PyExc_TypeError, "object_new(cls): cls takes object.__new__ and is not abstract");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    return t->tp_alloc(t, 0);
}

/* slots_new(cls, names, *values): object.__new__(cls) then setattr(obj, names[i], values[i])
 * in order, for a class that takes object's __new__ and setattr (no __setattr__ of its own)
 * whose every name is a plain slot of it (a member descriptor of type T_OBJECT_EX): each
 * value written at its slot's offset, without a Python __init__ frame and its stores
 * (semantics' QueueMessage: 13 slots, one a message a queue). The offsets are kept for the
 * last (cls, names) pair while the class's version tag stays; anything else is a TypeError,
 * never made another way. */
#define SLOTS_MAX 32
static PyTypeObject *sn_type;   /* strong, as names: their addresses are not reused while kept */
static PyObject *sn_names;
static unsigned int sn_version;
static Py_ssize_t sn_offsets[SLOTS_MAX];

static int slots_learn(PyTypeObject *t, PyObject *names) {
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (t->tp_new != PyBaseObject_Type.tp_new || t->tp_setattro != PyObject_GenericSetAttr
            || PyType_HasFeature(t, Py_TPFLAGS_IS_ABSTRACT) || n > SLOTS_MAX)
        goto refuse;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *d = PyUnicode_CheckExact(name) ? _PyType_Lookup(t, name) : NULL;
        PyMemberDef *m = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) ? ((PyMemberDescrObject *)d)->d_member : NULL;
        if (m == NULL || m->type != T_OBJECT_EX || (m->flags & READONLY)) goto refuse;
        sn_offsets[i] = m->offset;
    }
    Py_INCREF(t);
    Py_XSETREF(sn_type, t);
    Py_INCREF(names);
    Py_XSETREF(sn_names, names);
    sn_version = t->tp_version_tag;  /* the lookups gave it one; 0 (none to be had): learnt each call */
    return 0;
refuse:
    PyErr_SetString(PyExc_TypeError, "slots_new(cls, names, *values): cls takes object's __new__ and setattr, "
                    "each name a plain slot of it");
    return -1;
}

static PyObject *slots_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || !PyType_Check(args[0]) || !PyTuple_CheckExact(args[1])
            || PyTuple_GET_SIZE(args[1]) != nargs - 2) {
        PyErr_SetString(PyExc_TypeError, "slots_new(cls, names, *values): a class, a tuple, a value a name");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)args[0];
    if (t != sn_type || args[1] != sn_names || t->tp_version_tag != sn_version || sn_version == 0) {
        if (slots_learn(t, args[1]) < 0) return NULL;
    }
    PyObject *out = t->tp_alloc(t, 0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nargs - 2; i++) {
        PyObject **at = (PyObject **)((char *)out + sn_offsets[i]);
        Py_XSETREF(*at, Py_NewRef(args[i + 2]));  /* a name twice: the last value, as setattr */
    }
    return out;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *c, *m, *p, *a, *pr, *nm, *sc, *op;
    if (!PyArg_ParseTuple(args, "OOOOOO!O!O:configure", &c, &m, &p, &a, &pr, &PyDict_Type, &nm, &PyDict_Type, &sc, &op))
        return NULL;
    PyObject *types[5] = {c, m, p, a, pr};
    for (int i = 0; i < 5; i++) {
        if (!PyType_Check(types[i])) {
            PyErr_SetString(PyExc_TypeError, "configure: the first five arguments are classes");
            return NULL;
        }
    }
    Py_INCREF(c); Py_XSETREF(Content_t, c);
    Py_INCREF(m); Py_XSETREF(Method_t, m);
    Py_INCREF(p); Py_XSETREF(Publish_t, p);
    Py_INCREF(a); Py_XSETREF(Ack_t, a);
    Py_INCREF(pr); Py_XSETREF(Properties_t, pr);
    Py_INCREF(nm); Py_XSETREF(names, nm);
    Py_INCREF(sc); Py_XSETREF(scanned, sc);
    Py_INCREF(op); Py_XSETREF(chan_open, op);
    forget_last();  /* what the last lookups gave came from the caches replaced here */
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fast_event", (PyCFunction)(void (*)(void))fast_event, METH_FASTCALL,
     "The publish (with its header and body) or ack at pos as (event, next_pos), or None."},
    {"append_deliver", (PyCFunction)(void (*)(void))append_deliver, METH_FASTCALL,
     "Append basic.deliver, its content header and body frames to a bytearray."},
    {"ack_run", (PyCFunction)(void (*)(void))ack_run, METH_FASTCALL,
     "The delivery tags of the plain basic.ack frames at pos on one channel, or None."},
    {"tuple_of", (PyCFunction)(void (*)(void))tuple_of, METH_FASTCALL,
     "tuple_of(cls, *items): tuple.__new__(cls, items) for a tuple class."},
    {"tuple_new", (PyCFunction)(void (*)(void))tuple_new, METH_FASTCALL,
     "tuple_new(cls, items): tuple.__new__(cls, items)."},
    {"object_new", (PyCFunction)object_new, METH_O,
     "object_new(cls): object.__new__(cls) for a class that takes object's __new__."},
    {"slots_new", (PyCFunction)(void (*)(void))slots_new, METH_FASTCALL,
     "slots_new(cls, names, *values): object.__new__(cls) with each named slot set."},
    {"configure", configure, METH_VARARGS, "Hand over the event classes and shared caches."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) {
    const char *names_[] = {"channel", "method", "properties", "body", "ticket", "exchange", "routing_key",
                            "mandatory", "immediate", "delivery_tag", "multiple", "raw", "_flags", "_spans",
                            "_templates", "_cache", "state", "publish"};
    PyObject **slots[] = {&s_channel, &s_method, &s_properties, &s_body, &s_ticket, &s_exchange, &s_routing_key,
                          &s_mandatory, &s_immediate, &s_delivery_tag, &s_multiple, &s_raw, &s_flags, &s_spans,
                          &s_templates, &s_cache, &s_state, &s_publish};
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        *slots[i] = PyUnicode_InternFromString(names_[i]);
        if (*slots[i] == NULL) return NULL;
    }
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL) return NULL;
    return PyModule_Create(&module);
}
