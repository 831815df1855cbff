/* libFuzzer harness: the QMP byte stream (splitter) and request dispatch
 * (JSON parsing, negotiation, argument checks, error replies).  Every
 * reply must be an object with "return" or "error" whose strings jansson
 * can dump. */
#include <stdlib.h>
#include <string.h>

#include "ctl/qmp.h"
#include "ctl/qmp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct qmp_dispatch d;
	static int ready;
	if (!ready) {
		if (qmp_dispatch__init(&d, NULL))
			abort();
		ready = 1;
	}
	struct qmp_splitter s = { 0 };
	bool negotiated = size && (data[0] & 1);
	if (qmp_split__feed(&s, (const char *)data, size) == 0) {
		for (;;) {
			const char *text;
			size_t len;
			enum qmp_split_result r = qmp_split__next(&s, &text, &len);
			if (r == QMP_SPLIT_MORE)
				break;
			if (r == QMP_SPLIT_ERROR)
				continue;
			json_t *reply = qmp_dispatch__text(&d, text, len, &negotiated);
			if (!reply || !(json_object_get(reply, "return") || json_object_get(reply, "error")))
				abort();
			char *out = json_dumps(reply, 0);
			if (!out)
				abort();
			free(out);
			json_decref(reply);
		}
	}
	qmp_split__free(&s);
	/* the whole input as one request text too */
	bool neg = true;
	json_t *reply = qmp_dispatch__text(&d, (const char *)data, size, &neg);
	if (!reply)
		abort();
	json_decref(reply);
	return 0;
}
