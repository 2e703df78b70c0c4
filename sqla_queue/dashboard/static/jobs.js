// The jobs page's select-all box: checks or clears every job of the page.
document.addEventListener("change", function (event) {
  if (event.target.id !== "select-all") return;
  document.querySelectorAll('#jobs input[name="job_id"]').forEach(function (box) {
    box.checked = event.target.checked;
  });
});
