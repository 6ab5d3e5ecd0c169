/* The fake's field values, clock-event reasons, PCIe, NVLink, VBIOS, persistence mode and MIG
 * (fakenvml.c documents the configuration). */
#include <string.h>

#include "fakenvml.h"

/* nvmlDeviceGetTemperatureV (nvml.h: nvmlTemperature_v1_t {version, sensorType, temperature},
 * nvmlTemperature_v1 = NVML_STRUCT_VERSION(Temperature, 1) = sizeof | 1 << 24), the call that
 * replaces the deprecated nvmlDeviceGetTemperature (pynvml: "will be removed in CUDA 14.0").
 * Its own call name `temp_v` for fail=/error_on= (so a test can tell which call answered);
 * `unsupported=temp` covers both, as the sensor is one. Left out with -DFAKE_NO_TEMPERATURE_V
 * or -DFAKE_OLD_DRIVER (a driver before the call existed: pynvml raises FunctionNotFound). */
#if !defined(FAKE_NO_TEMPERATURE_V) && !defined(FAKE_OLD_DRIVER)
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_v1_t *t) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "temp_v");
    if (!t) return NVML_ERROR_INVALID_ARGUMENT;
    if (t->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (t->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT; /* the only sensor */
    if (unsupported(g, "temp")) return NVML_ERROR_NOT_SUPPORTED;
    t->temperature = (int)g->temp;
    return NVML_SUCCESS;
}
#endif

/* Field values (nvml.h's NVML_FI_* ids): the recovery action, the NVLink link count, the ECC mode current and
 * pending; every other field NOT_SUPPORTED in its own nvmlReturn. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "fields");
    if (!values || count < 0) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = 0;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->nvmlReturn = NVML_SUCCESS;
        v->value.ullVal = 0;
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && !unsupported(g, "recovery")) v->value.uiVal = g->recovery;
        else if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT && g->nlinks >= 0) v->value.uiVal = (unsigned)g->nlinks;
        else if (v->fieldId == NVML_FI_DEV_ECC_CURRENT && !unsupported(g, "ecc")) v->value.uiVal = (unsigned)g->ecc;
        else if (v->fieldId == NVML_FI_DEV_ECC_PENDING && !unsupported(g, "ecc")) v->value.uiVal = (unsigned)g->ecc_pending;
        else v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

/* Clock-event (throttle) reasons: a driver exports both names; the "ClocksEvent" ones came with driver 535
 * (nvml.h 12.2 deprecates the "ClocksThrottle" ones), so the old driver (-DFAKE_OLD_DRIVER) has only those. */
static nvmlReturn_t clock_reasons(nvmlDevice_t dev, unsigned long long *reasons, int supported) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "clocks");
    if (unsupported(g, "clocks")) return NVML_ERROR_NOT_SUPPORTED;
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = supported ? g->clocks_supported : g->clocks_event;
    return NVML_SUCCESS;
}
#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    return clock_reasons(dev, reasons, 0);
}
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    return clock_reasons(dev, reasons, 1);
}
#endif
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    return clock_reasons(dev, reasons, 0);
}
nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    return clock_reasons(dev, reasons, 1);
}

static nvmlReturn_t pcie(nvmlDevice_t dev, int which, unsigned *out) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "pcie");
    if (unsupported(g, "pcie")) return NVML_ERROR_NOT_SUPPORTED;
    *out = g->pcie[which];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned *gen) { return pcie(dev, 0, gen); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned *gen) { return pcie(dev, 1, gen); }
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned *gen) { return pcie(dev, 2, gen); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned *width) { return pcie(dev, 3, width); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned *width) { return pcie(dev, 4, width); }

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned link, unsigned *active) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "nvlink");
    if (g->nlinks < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->nlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *active = (unsigned)g->links[link];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char *version, unsigned length) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "vbios");
    if (unsupported(g, "vbios")) return NVML_ERROR_NOT_SUPPORTED;
    return copy_str(g->vbios, version, length);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, unsigned *mode) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "persistence");
    if (unsupported(g, "persistence")) return NVML_ERROR_NOT_SUPPORTED;
    *mode = g->persistence;
    return NVML_SUCCESS;
}

/* --- MIG ------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned *current, unsigned *pending) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "mig");
    if (unsupported(g, "mig")) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned)(g->mig != 0);
    *pending = (unsigned)(g->mig_pending != 0); /* a change waits for a GPU reset */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned *count) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "mig");
    if (unsupported(g, "mig")) return NVML_ERROR_NOT_SUPPORTED;
    *count = g->mig ? 7 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned index, nvmlDevice_t *mig) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "mig");
    if (!g->mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)g->nmig) return NVML_ERROR_NOT_FOUND;
    *mig = handle_of(&g->migs[index]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned *is_mig) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *is_mig = as_mig(dev) != NULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned *id) {
    fake_mig *m = as_mig(dev);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT; /* not a MIG device handle */
    *id = m->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned *id) {
    fake_mig *m = as_mig(dev);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t dev, nvmlDevice_t *parent) {
    fake_mig *m = as_mig(dev);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = handle_of(m->parent);
    return NVML_SUCCESS;
}
