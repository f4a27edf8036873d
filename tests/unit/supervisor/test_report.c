/* test_report.c - supervisor/validate.c's run report: injected faults are counted when a
 * rank reports them firing, not when they are asked for (`--inject`, `cohort inject`); the
 * ones that never fired are listed apart. */
#include "common/error.h"
#include "supervisor/validate.h"

#include "tests/test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int no_send(void *ctx, int rank, const ProtobufCMessage *body) {
    (void)ctx;
    (void)rank;
    (void)body;
    return 0;
}

static svv *validator(int world, fi_schedule *inject) {
    svv_options o;
    memset(&o, 0, sizeof o);
    rr_options_default(&o.rr, world);
    o.rr.world = world;
    o.straggler_threshold = 0.75;
    o.inject = inject;
    svv *v = NULL;
    CHECK(svv_new(&v, &o, no_send, NULL) == 0);
    return v;
}

/* Two --inject specs and three `cohort inject` requests; one of each fires. */
static void fired_not_requested(void) {
    char *specs[] = {"nan@rank=0,step=3", "kill@rank=1,step=50"};
    fi_schedule s;
    REQUIRE(fi_schedule_parse(&s, specs, 2, 0, 2, 100) == 0);
    svv *v = validator(2, &s);
    svv_on_event(v, 0, "inject: nan on rank 0 at step 3, micro batch 0, phase forward (--inject nan@rank=0,step=3)\n");
    svv_on_event(v, 1, "inject: spike@rank=1,step=20 (cohort inject), requested at iteration 10");
    svv_on_event(v, 1, "inject: nan@rank=1,step=30 (cohort inject), requested at iteration 10");
    svv_on_event(v, 0, "inject: nan@rank=0,step=31 (cohort inject), requested at iteration 11");
    svv_on_event(v, 1, "inject: spike on rank 1 at step 20, micro batch 0, phase forward (--inject spike@rank=1,step=20)");
    svv_counts c;
    svv_counts_get(v, &c);
    CHECK_MSG(c.faults == 2, "%d faults: the requests were counted", c.faults);

    char path[] = "/tmp/cohort-report-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    char *text = NULL;
    size_t len = 0;
    FILE *human = open_memstream(&text, &len);
    REQUIRE(human);
    CHECK(svv_write_report(v, human, path, 0, 1.0) == 0);
    fclose(human);
    CHECK_MSG(strstr(text, "; 2 fault(s),"), "%s", text);
    CHECK_MSG(strstr(text, "injections: 5 asked for (2 by --inject, 3 by cohort inject), 2 reported fired"), "%s", text);
    CHECK_MSG(strstr(text, "not fired: kill@rank=1,step=50 (--inject)"), "%s", text);
    CHECK_MSG(strstr(text, "not fired: nan@rank=1,step=30 (cohort inject at iteration 10)"), "%s", text);
    CHECK_MSG(!strstr(text, "not fired: spike@rank=1,step=20"), "%s", text);
    free(text);

    json_t *r = json_load_file(path, 0, NULL);
    REQUIRE(r);
    CHECK(json_array_size(json_object_get(r, "faults")) == 2);
    json_t *inj = json_object_get(r, "injections");
    CHECK(json_integer_value(json_object_get(inj, "requested")) == 5);
    CHECK(json_integer_value(json_object_get(inj, "fired")) == 2);
    json_t *list = json_object_get(inj, "list");
    CHECK(json_array_size(list) == 5);
    int unfired = 0;
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) unfired += !json_is_true(json_object_get(x, "fired"));
    CHECK(unfired == 3);
    json_t *third = json_array_get(list, 2);
    CHECK(!strcmp(json_string_value(json_object_get(third, "spec")), "spike@rank=1,step=20"));
    CHECK(!strcmp(json_string_value(json_object_get(third, "source")), "cohort inject"));
    CHECK(json_is_true(json_object_get(third, "fired")));
    CHECK(json_integer_value(json_object_get(third, "requested_at")) == 10);
    json_decref(r);
    unlink(path);
    svv_destroy(&v);
    fi_schedule_free(&s);
}

/* Thousands of requests that never fire: no fault counted, every request counted. */
static void many_requests(void) {
    svv *v = validator(2, NULL);
    char line[200];
    for (int k = 0; k < 3000; k++) {
        snprintf(line, sizeof line, "inject: nan@rank=0,step=%d (cohort inject), requested at iteration 5", 100 + k);
        svv_on_event(v, 0, line);
    }
    svv_counts c;
    svv_counts_get(v, &c);
    CHECK(c.faults == 0);
    char *text = NULL;
    size_t len = 0;
    FILE *human = open_memstream(&text, &len);
    REQUIRE(human);
    CHECK(svv_write_report(v, human, NULL, 0, 1.0) == 0);
    fclose(human);
    CHECK_MSG(strstr(text, "; 0 fault(s),"), "%s", text);
    CHECK_MSG(strstr(text, "injections: 3000 asked for (0 by --inject, 3000 by cohort inject), 0 reported fired"),
              "%s", text);
    CHECK_MSG(strstr(text, "... and 2984 more not fired"), "%s", text);
    free(text);
    svv_destroy(&v);
}

int main(void) {
    RUN(fired_not_requested);
    RUN(many_requests);
    return TEST_EXIT();
}
