-- Help tags for doc/agent_bash.txt, so `:help agent_bash` works right after a checkout or a
-- plugin manager's install (neither runs `:helptags` for a local directory). The tags go next
-- to the file when doc/ is writable, else into a copy under stdpath('cache') added to
-- 'runtimepath'.

local M = {}

--- Generates the tags for the plugin at `root`. Returns the directory holding them, or nil
--- and the error.
---@param root string the plugin's directory
---@param opts? {writable?: boolean} writable = false forces the cache copy (tests)
---@return string? dir
---@return string? err
function M.generate(root, opts)
  opts = opts or {}
  local doc = root .. '/doc'
  local writable = opts.writable
  if writable == nil then
    writable = vim.fn.filewritable(doc) == 2
  end
  if writable then
    local ok, err = pcall(vim.cmd.helptags, vim.fn.fnameescape(doc))
    if ok then
      return doc
    end
    require('agent_bash.log').warn('helptags %s: %s', doc, tostring(err))
  end
  local base = vim.fn.stdpath('cache') .. '/agent_bash'
  local dir = base .. '/doc'
  vim.fn.mkdir(dir, 'p')
  local ok, err = pcall(function()
    vim.fn.writefile(vim.fn.readfile(doc .. '/agent_bash.txt'), dir .. '/agent_bash.txt')
    vim.cmd.helptags(vim.fn.fnameescape(dir))
  end)
  if not ok then
    require('agent_bash.log').warn('helptags %s: %s', dir, tostring(err))
    return nil, tostring(err)
  end
  if not vim.tbl_contains(vim.api.nvim_list_runtime_paths(), base) then
    vim.opt.runtimepath:append(base)
  end
  return dir
end

return M
