package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/store"
)

func TestBadRequests(t *testing.T) {
	e := newEnv(t, envConfig{
		opts:    Options{MaxBatch: 4},
		storeOp: store.Options{MaxMessageBytes: 64 << 10},
	})
	e.postJSON(t, "/api/v1/topics/t/messages", `{"body":"exists"}`, http.StatusCreated)

	const (
		msgs = "/api/v1/topics/t/messages"
		js   = "application/json"
		raw  = "application/octet-stream"
	)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		method string
		path   string
		ct     string
		header http.Header
		body   string
		status int
		code   string
	}{
		// Produce: topic.
		{"topic with a space", "POST", "/api/v1/topics/a%20b/messages", js, nil, `{}`, 400, CodeInvalidTopic},
		{"topic with a slash", "POST", "/api/v1/topics/a%2Fb/messages", js, nil, `{}`, 400, CodeInvalidTopic},
		{"system topic", "POST", "/api/v1/topics/%25RETRY%25g/messages", js, nil, `{}`, 400, CodeInvalidTopic},
		{"topic too long", "POST", "/api/v1/topics/" + strings.Repeat("x", 128) + "/messages", raw, nil, `x`, 400, CodeInvalidTopic},
		// Produce: JSON.
		{"empty JSON body", "POST", msgs, js, nil, ``, 400, CodeBadJSON},
		{"truncated JSON", "POST", msgs, js, nil, `{"body":`, 400, CodeBadJSON},
		{"JSON syntax", "POST", msgs, js, nil, `{"body" "x"}`, 400, CodeBadJSON},
		{"unknown field", "POST", msgs, js, nil, `{"bdy":"x"}`, 400, CodeBadJSON},
		{"field in other case", "POST", msgs, js, nil, `{"Body":"x"}`, 400, CodeBadJSON},
		{"field twice", "POST", msgs, js, nil, `{"body":"x","body":"y"}`, 400, CodeBadJSON},
		{"escaped field twice", "POST", msgs, js, nil, `{"body":"x","b\u006fdy":"y"}`, 400, CodeBadJSON},
		{"field twice in a batch", "POST", msgs, js, nil, `[{"tag":"x","tag":"y"}]`, 400, CodeBadJSON},
		{"ack field in other case", "POST", "/api/v1/topics/t/ack", js, nil, `{"Handle":"h"}`, 400, CodeBadJSON},
		{"wrong type", "POST", msgs, js, nil, `{"key":1}`, 400, CodeBadJSON},
		{"keys not a list", "POST", msgs, js, nil, `{"keys":"a"}`, 400, CodeBadJSON},
		{"property not a string", "POST", msgs, js, nil, `{"properties":{"a":{}}}`, 400, CodeBadJSON},
		{"data after the object", "POST", msgs, js, nil, `{} {}`, 400, CodeBadJSON},
		{"null", "POST", msgs, js, nil, `null`, 400, CodeBadJSON},
		{"string", "POST", msgs, js, nil, `"x"`, 400, CodeBadJSON},
		{"null in a batch", "POST", msgs, js, nil, `[{},null]`, 400, CodeBadJSON},
		{"number in a batch", "POST", msgs, js, nil, `[1]`, 400, CodeBadJSON},
		{"unclosed batch", "POST", msgs, js, nil, `[{}`, 400, CodeBadJSON},
		{"batch without commas", "POST", msgs, js, nil, `[{} {}]`, 400, CodeBadJSON},
		{"empty batch", "POST", msgs, js, nil, `[]`, 400, CodeBadRequest},
		{"batch over MaxBatch", "POST", msgs, js, nil, `[{},{},{},{},{}]`, 413, CodeBatchTooLarge},
		{"body and body_base64", "POST", msgs, js, nil, `{"body":"a","body_base64":"YQ=="}`, 400, CodeBadRequest},
		{"bad base64", "POST", msgs, js, nil, `{"body_base64":"!!!"}`, 400, CodeBadRequest},
		{"deliver_at not RFC 3339", "POST", msgs, js, nil, `{"deliver_at":"tomorrow"}`, 400, CodeBadRequest},
		{"deliver_at a number", "POST", msgs, js, nil, `{"deliver_at":1}`, 400, CodeBadJSON},
		{"empty property name", "POST", msgs, js, nil, `{"properties":{"":"x"}}`, 400, CodeInvalidMessage},
		{"empty index key", "POST", msgs, js, nil, `{"keys":[""]}`, 400, CodeInvalidMessage},
		{"properties too large", "POST", msgs, js, nil, `{"properties":{"p":"` + strings.Repeat("v", 40<<10) + `"}}`, 413, CodePropertiesTooLarge},
		{"message too large", "POST", msgs, raw, nil, strings.Repeat("x", 100<<10), 413, CodeMessageTooLarge},
		{"headers with JSON", "POST", msgs, js, h("X-Ferrymq-Key", "k"), `{}`, 400, CodeBadRequest},
		// Produce: headers.
		{"unknown header", "POST", msgs, raw, h("X-Ferrymq-Tags", "a"), `x`, 400, CodeBadRequest},
		{"key twice", "POST", msgs, raw, h("X-Ferrymq-Key", "a", "X-Ferrymq-Key", "b"), `x`, 400, CodeBadRequest},
		{"property twice", "POST", msgs, raw, h("X-Ferrymq-Prop-A", "1", "x-ferrymq-prop-a", "2"), `x`, 400, CodeBadRequest},
		{"property without a name", "POST", msgs, raw, h("X-Ferrymq-Prop-", "1"), `x`, 400, CodeBadRequest},
		{"deliver-at not RFC 3339", "POST", msgs, raw, h("X-Ferrymq-Deliver-At", "tomorrow"), `x`, 400, CodeBadRequest},
		{"header not UTF-8", "POST", msgs, raw, h("X-Ferrymq-Tag", "\xff"), `x`, 400, CodeBadRequest},
		// Pop.
		{"no group", "GET", msgs, "", nil, ``, 400, CodeInvalidGroup},
		{"bad group", "GET", msgs + "?group=a%20b", "", nil, ``, 400, CodeInvalidGroup},
		{"group twice", "GET", msgs + "?group=a&group=b", "", nil, ``, 400, CodeBadRequest},
		{"unknown parameter", "GET", msgs + "?group=g&limit=1", "", nil, ``, 400, CodeBadRequest},
		{"bad query", "GET", msgs + "?group=g&max=%zz", "", nil, ``, 400, CodeBadRequest},
		{"max not a number", "GET", msgs + "?group=g&max=ten", "", nil, ``, 400, CodeBadRequest},
		{"negative max", "GET", msgs + "?group=g&max=-1", "", nil, ``, 400, CodeBadRequest},
		{"zero max", "GET", msgs + "?group=g&max=0", "", nil, ``, 400, CodeBadRequest},
		{"max over 1024", "GET", msgs + "?group=g&max=1025", "", nil, ``, 400, CodeBadRequest},
		{"huge max", "GET", msgs + "?group=g&max=99999999999999999999", "", nil, ``, 400, CodeBadRequest},
		{"bad wait", "GET", msgs + "?group=g&wait=5", "", nil, ``, 400, CodeBadRequest},
		{"negative wait", "GET", msgs + "?group=g&wait=-1s", "", nil, ``, 400, CodeBadRequest},
		{"bad invisible", "GET", msgs + "?group=g&invisible=long", "", nil, ``, 400, CodeBadRequest},
		{"zero invisible", "GET", msgs + "?group=g&invisible=0s", "", nil, ``, 400, CodeInvisibleTime},
		{"invisible too short", "GET", msgs + "?group=g&invisible=1s", "", nil, ``, 400, CodeInvisibleTime},
		{"invisible too long", "GET", msgs + "?group=g&invisible=13h", "", nil, ``, 400, CodeInvisibleTime},
		{"bad orderly", "GET", msgs + "?group=g&orderly=maybe", "", nil, ``, 400, CodeBadRequest},
		{"unknown topic", "GET", "/api/v1/topics/nope/messages?group=g", "", nil, ``, 404, CodeTopicNotFound},
		{"pop invalid topic", "GET", "/api/v1/topics/a%20b/messages?group=g", "", nil, ``, 400, CodeInvalidTopic},
		// Ack.
		{"ack bad JSON", "POST", "/api/v1/topics/t/ack", js, nil, `{"handles":[`, 400, CodeBadJSON},
		{"ack array", "POST", "/api/v1/topics/t/ack", js, nil, `["h"]`, 400, CodeBadJSON},
		{"ack unknown field", "POST", "/api/v1/topics/t/ack", js, nil, `{"receipt":"h"}`, 400, CodeBadJSON},
		{"ack no handles", "POST", "/api/v1/topics/t/ack", js, nil, `{}`, 400, CodeBadRequest},
		{"ack empty handles", "POST", "/api/v1/topics/t/ack", js, nil, `{"handles":[]}`, 400, CodeBadRequest},
		{"ack both forms", "POST", "/api/v1/topics/t/ack", js, nil, `{"handle":"a","handles":["b"]}`, 400, CodeBadRequest},
		{"ack too many", "POST", "/api/v1/topics/t/ack", js, nil, `{"handles":["a","b","c","d","e"]}`, 413, CodeBatchTooLarge},
		{"ack handle a number", "POST", "/api/v1/topics/t/ack", js, nil, `{"handle":1}`, 400, CodeBadJSON},
		{"ack invalid topic", "POST", "/api/v1/topics/a%20b/ack", js, nil, `{"handle":"h"}`, 400, CodeInvalidTopic},
		// Invisible.
		{"invisible missing", "POST", "/api/v1/topics/t/invisible", js, nil, `{"handle":"h"}`, 400, CodeBadRequest},
		{"invisible not a duration", "POST", "/api/v1/topics/t/invisible", js, nil, `{"handle":"h","invisible":"30"}`, 400, CodeBadRequest},
		{"invisible a number", "POST", "/api/v1/topics/t/invisible", js, nil, `{"handle":"h","invisible":30}`, 400, CodeBadJSON},
		{"invisible garbage handle", "POST", "/api/v1/topics/t/invisible", js, nil, `{"handle":"h","invisible":"30s"}`, 400, CodeInvalidHandle},
		{"invisible empty handle", "POST", "/api/v1/topics/t/invisible", js, nil, `{"invisible":"30s"}`, 400, CodeInvalidHandle},
		{"invisible out of range", "POST", "/api/v1/topics/t/invisible", js, nil, `{"handle":"h","invisible":"1s"}`, 400, CodeInvisibleTime},
		// Methods and paths.
		{"DELETE messages", "DELETE", msgs, "", nil, ``, 405, CodeMethodNotAllowed},
		{"PUT messages", "PUT", msgs, js, nil, `{}`, 405, CodeMethodNotAllowed},
		{"HEAD messages", "HEAD", msgs + "?group=g", "", nil, ``, 405, ""},
		{"GET ack", "GET", "/api/v1/topics/t/ack", "", nil, ``, 405, CodeMethodNotAllowed},
		{"GET invisible", "GET", "/api/v1/topics/t/invisible", "", nil, ``, 405, CodeMethodNotAllowed},
		{"unknown path", "GET", "/api/v1/nope", "", nil, ``, 404, CodeNotFound},
		{"topic without action", "GET", "/api/v1/topics/t", "", nil, ``, 404, CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := e.do(t, req{method: tc.method, path: tc.path, contentType: tc.ct, header: tc.header, body: strings.NewReader(tc.body)})
			require.Equal(t, tc.status, resp.StatusCode, "body: %s", b)
			if tc.status == http.StatusMethodNotAllowed {
				require.NotEmpty(t, resp.Header.Get("Allow"))
			}
			if tc.method == http.MethodHead {
				return // no body
			}
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			got := decode[errorJSON](t, b)
			require.Equal(t, tc.code, got.Code, "error: %s", got.Error)
			require.NotEmpty(t, got.Error)
			require.NotContains(t, got.Error, "\n")
		})
	}

	// None of that hurt anything: the message is still there for a pop.
	e.popN(t, "t", "group=after", 1)
}

func TestFailureLogs(t *testing.T) {
	e := newEnv(t, envConfig{})
	const secret = "s3cr3t"
	bad := []req{
		{method: "POST", path: "/api/v1/topics/t/messages", contentType: "application/json", body: strings.NewReader(`{"` + secret + `":1}`)},
		{method: "POST", path: "/api/v1/topics/t/messages", contentType: "application/json", body: strings.NewReader(`{"key":"` + secret + `", "body":`)},
		{method: "POST", path: "/api/v1/topics/t/messages", contentType: "application/json", body: strings.NewReader(`{"deliver_at":"` + secret + `"}`)},
		{method: "POST", path: "/api/v1/topics/t/messages", contentType: "application/json", body: strings.NewReader(`{"properties":{"` + secret + `":1}}`)},
		{method: "POST", path: "/api/v1/topics/t/messages", header: http.Header{"X-Ferrymq-Deliver-At": {secret}}, body: strings.NewReader(secret)},
		{method: "POST", path: "/api/v1/topics/t/invisible", body: strings.NewReader(`{"handle":"` + secret + `","invisible":"30s"}`)},
	}
	for _, r := range bad {
		resp, _ := e.do(t, r)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}
	e.postJSON(t, "/api/v1/topics/t/messages", `{"body":"`+secret+`"}`, http.StatusCreated)
	e.postJSON(t, "/api/v1/topics/t/ack", fmt.Sprintf(`{"handle":%q}`, secret), http.StatusOK)

	lines := e.logs.lines(`"message":"request failed"`)
	require.Len(t, lines, len(bad), "one line per failed request, none for successes:\n%s", e.logs)
	for _, l := range lines {
		require.Contains(t, l, `"level":"debug"`)
		require.Contains(t, l, `"status":400`)
		require.Contains(t, l, `"route":"POST /api/v1/topics/{topic}/`)
	}
	require.NotContains(t, e.logs.String(), secret)
}
